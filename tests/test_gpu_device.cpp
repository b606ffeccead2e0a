// CUDA tensors, the device actor and the actor backend's device exchange on a
// GPU (label gpu; skipped without a device): memory and copies, jobs that
// fail (a CUDA launch error, a throwing enqueue, a deadline), collectives of
// ranks sharing the GPU (many in flight, several groups), and the failures of
// the exchange (a rank that never joins, calls that disagree, a rank that
// leaves).

#include <doctest/doctest.h>

#include <dlpack/dlpack.h>

#include <atomic>
#include <numeric>
#include <thread>

#include "check_error.hpp"
#include "troupe/testing.hpp"
#include "troupe/troupe.hpp"

#ifdef TROUPE_HAVE_CUDA
#include "actors/device_actor.hpp"
#include "actors/rank_runtime.hpp"
#include "cuda/kernels.hpp"
#endif

using namespace troupe;
using troupe::test::check_error;

namespace {

tensor cuda_iota(std::int64_t n, float base) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), base);
  auto d = tensor::empty({n}, dtype::float32, device::cuda(0));
  d.copy_from(tensor::from_vector(v));
  return d;
}

}  // namespace

TEST_CASE("cuda tensors: allocation, copies both ways, zeros, clone, DLPack") {
  auto d = cuda_iota(1000, 1.0f);
  CHECK(d.get_device() == device::cuda(0));
  auto v = d.to_vector<float>();
  CHECK(v.front() == 1.0f);
  CHECK(v.back() == 1000.0f);
  auto c = d.clone();
  CHECK_FALSE(c.is_same(d));
  CHECK(c.to_vector<float>() == v);
  c.zero_();
  CHECK(c.to_vector<float>() == std::vector<float>(1000, 0.0f));
  auto z = tensor::zeros({3, 4}, dtype::int64, device::cuda(0));
  CHECK(z.to_vector<std::int64_t>() == std::vector<std::int64_t>(12, 0));
  auto* m = d.to_dlpack();
  CHECK(m->dl_tensor.device.device_type == kDLCUDA);
  auto back = tensor::from_dlpack(m);
  CHECK(back.get_device() == device::cuda(0));
  CHECK(back.to_vector<float>() == v);
  check_error([] { tensor::empty({1}, dtype::float32, device::cuda(cuda_device_count())); },
              errc::invalid_argument, {"tensor.empty", "does not exist"});
}

#ifdef TROUPE_HAVE_CUDA
TEST_CASE("the device actor turns failures into failed works, never aborts") {
  detail::rank_runtime rt(0, "gpu-device-test", 2);
  auto q = detail::gpu::device_queue_of(rt, 0);
  CHECK(q->device() == 0);
  auto job = [](const char* name) {
    detail::gpu::device_job j;
    j.name = name;
    j.handle = work::make(name, "g");
    return j;
  };
  // A kernel launch error names the call, the device and CUDA's words.
  auto bad = job("allreduce");
  bad.enqueue = [](detail::gpu::stream_t s) {
    detail::gpu::launch_invalid_for_test("allreduce", 0, s);
  };
  auto w = bad.handle;
  q->submit(std::move(bad));
  check_error([&] { w.wait(std::chrono::seconds(10)); }, errc::backend, {"allreduce", "cuda:0"});
  // The actor goes on: a good job after it completes, with its outputs and `after`.
  std::atomic<bool> after{false};
  auto good = job("broadcast");
  auto out = cuda_iota(4, 0.0f);
  good.outputs = {out};
  good.enqueue = [](detail::gpu::stream_t) {};
  good.after = [&] { after = true; };
  auto g = good.handle;
  q->submit(std::move(good));
  g.wait(std::chrono::seconds(10));
  CHECK(after.load());
  CHECK(g.result().front().is_same(out));
  // A throwing enqueue, and an unhealthy job (NCCL's asynchronous errors).
  auto throws = job("gather");
  throws.enqueue = [](detail::gpu::stream_t) { throw error(errc::backend, "gather: no luck"); };
  auto t = throws.handle;
  q->submit(std::move(throws));
  check_error([&] { t.wait(std::chrono::seconds(10)); }, errc::backend, {"gather: no luck"});
  std::atomic<bool> told{false};
  auto sick = job("scatter");
  auto big = tensor::zeros({1 << 24}, dtype::float32, device::cuda(0));
  auto other = tensor::zeros({1 << 24}, dtype::float32, device::cuda(0));
  sick.enqueue = [big, other](detail::gpu::stream_t s) {
    // Keep the stream busy (200 real reductions of 64 MiB, about 10 ms on
    // an H100) so that a poll asks for health before the work is done.
    detail::gpu::reduce_args a;
    a.count = 1 << 24;
    a.srcs = {big.data(), other.data()};
    a.dsts = {big.data()};
    for (int i = 0; i < 200; ++i) detail::gpu::reduce("scatter", 0, a, s);
  };
  sick.health = [] { return std::string("scatter: communicator failed"); };
  sick.on_failure = [&](errc, const std::string&) { told = true; };
  auto k = sick.handle;
  q->submit(std::move(sick));
  check_error([&] { k.wait(std::chrono::seconds(10)); }, errc::backend,
              {"scatter: communicator failed"});
  CHECK(told.load());
}
#endif

TEST_CASE("ranks sharing the GPU: many allreduces in flight, several groups interleaved") {
  for (int n : {2, 3, 4, 7}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto odd_even = w.new_group({0, n - 1});
      std::vector<tensor> xs;
      std::vector<work> ws;
      for (int i = 0; i < 100; ++i) {
        xs.push_back(cuda_iota(1000 + i, static_cast<float>(w.rank())));
        ws.push_back(w.default_group().allreduce(xs.back()));
        if (odd_even->is_member() && i % 10 == 0) ws.push_back(odd_even->barrier());
      }
      for (auto& x : ws) x.wait(std::chrono::seconds(60));
      const float ranks_sum = static_cast<float>(n * (n - 1) / 2);
      for (int i = 0; i < 100; ++i) {
        auto v = xs[static_cast<std::size_t>(i)].to_vector<float>();
        CHECK(v[0] == ranks_sum);
        CHECK(v.back() == ranks_sum + static_cast<float>(n * (999 + i)));
      }
    });
  }
}

TEST_CASE("the device exchange: a missing rank times out, disagreeing calls fail everywhere") {
  std::atomic<bool> timed_out{false};
  testing::run_ranks(2, [&](world& w) {
    auto& pg = w.default_group();
    auto x = cuda_iota(8, 0.0f);
    const auto short_wait = std::chrono::milliseconds(300);
    if (w.rank() == 0) {
      check_error([&] { pg.allreduce(tensor_list{x}, {.timeout = short_wait}).wait(); },
                  errc::timeout, {"allreduce", "Timed out after 300 ms", "rank 1"});
      timed_out = true;
    } else {
      // Joining late, at the same sequence number, fails at once with the same reason.
      while (!timed_out) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      check_error([&] { pg.allreduce(tensor_list{x}, {.timeout = short_wait}).wait(); },
                  errc::timeout, {"allreduce", "rank 1"});
    }
    auto y = cuda_iota(8 + w.rank(), 0.0f);
    check_error([&] { pg.allreduce(y).wait(); }, errc::mismatch,
                {"collective mismatch", "rank 0 called allreduce (SUM) of 8 float32 elements",
                 "rank 1 called allreduce (SUM) of 9 float32 elements"});
    if (w.rank() == 0)
      check_error([&] { pg.allreduce(x).wait(); }, errc::mismatch, {"collective mismatch"});
    else
      check_error([&] { pg.broadcast(x, 0).wait(); }, errc::mismatch, {"collective mismatch"});
    // The group still works afterwards.
    pg.allreduce(x).wait();
    CHECK(x.to_vector<float>()[1] == 2.0f);
  });
}
