// The actor backend's device exchange (backends/device_exchange.hpp) on host
// memory: its rounds of posts, shares and finishes run on queues that stand
// in for device actors and on device_ops that stand in for CUDA (events are
// tokens, the reduction kernel is the CPU's). Every collective family on 1,
// 2, 3, 4 and 7 ranks with many rounds in flight, and every way a round
// fails: a rank that never posts, calls that disagree, a rank that leaves,
// abort, a failing kernel, devices that cannot reach each other; and no
// event is left behind.

#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <numeric>
#include <thread>

#include "../backends/device_exchange.hpp"
#include "../backends/direct_plan.hpp"
#include "../cuda/device_ops.hpp"
#include "../cuda/device_queue.hpp"
#include "check_error.hpp"
#include "reference.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::detail::call_ptr;
using troupe::detail::collective_call;
using troupe::detail::op_code;
using troupe::test::check_error;
namespace gpu = troupe::detail::gpu;

namespace {

/// Events are counted tokens; the kernel is the CPU's. A reduction whose
/// first source is `poisoned` fails as a launch would.
class host_ops final : public gpu::device_ops {
 public:
  gpu::event_t record_event(const char*, int, gpu::stream_t) override {
    ++live;
    return new int(0);
  }
  void wait_event(const char*, int, gpu::stream_t, gpu::event_t e) override {
    REQUIRE(e != nullptr);  // waits only on recorded events
  }
  void destroy_event(int, gpu::event_t e) noexcept override {
    if (!e) return;
    --live;
    delete static_cast<int*>(e);
  }
  void reduce(const char* op, int device, const gpu::reduce_args& a, gpu::stream_t) override {
    if (!a.srcs.empty() && a.srcs.front() == poisoned)
      throw error(errc::backend, std::string(op) + ": cuda:" + std::to_string(device) +
                                     ": reduce_kernel failed: an illegal memory access");
    detail::run_on_cpu({a});
  }
  void connect(const char* op, int a, int b) override {
    if (separate_devices)
      throw error(errc::invalid_argument, std::string(op) + ": cuda:" + std::to_string(a) +
                                              " cannot reach cuda:" + std::to_string(b));
  }
  std::atomic<int> live{0};
  const void* poisoned = nullptr;
  bool separate_devices = false;
};

/// A device actor on the host: runs each job on its own thread, in order.
class host_queue final : public gpu::device_queue {
 public:
  explicit host_queue(int device) : device_(device), worker_([this] { run(); }) {}
  ~host_queue() override {
    {
      std::lock_guard<std::mutex> g{mtx_};
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  int device() const noexcept override { return device_; }
  void submit(gpu::device_job job) override {
    {
      std::lock_guard<std::mutex> g{mtx_};
      jobs_.push_back(std::move(job));
    }
    cv_.notify_all();
  }
  void abort(const std::string&) override {}

 private:
  void run() {
    for (;;) {
      gpu::device_job j;
      {
        std::unique_lock<std::mutex> g{mtx_};
        cv_.wait(g, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        j = std::move(jobs_.front());
        jobs_.pop_front();
      }
      try {
        j.enqueue(nullptr);
        if (j.after) j.after();
        if (j.handle.valid()) j.handle.complete(j.outputs);
      } catch (const error& e) {
        if (j.on_failure) j.on_failure(e.code(), e.what());
        if (j.handle.valid()) j.handle.fail(std::current_exception());
      }
    }
  }
  int device_;
  std::mutex mtx_;
  std::condition_variable cv_;
  std::deque<gpu::device_job> jobs_;
  bool stop_ = false;
  std::thread worker_;
};

/// n ranks: their queues and the exchange.
struct ranks {
  ranks(int n, host_ops& ops, const std::string& key) : n(n) {
    for (int r = 0; r < n; ++r) queues.push_back(std::make_shared<host_queue>(r % 2));
    x = gpu::device_exchange::open(key, n, ops);
  }
  ~ranks() {
    // Jobs still queued hold the exchange, and it holds the queues: let it go
    // first, so that no queue is destroyed by its own worker thread.
    std::weak_ptr<gpu::device_exchange> gone = x;
    x.reset();
    while (!gone.expired()) std::this_thread::sleep_for(1ms);
  }
  int n;
  std::vector<std::shared_ptr<host_queue>> queues;
  std::shared_ptr<gpu::device_exchange> x;
};

call_ptr call(op_code code, const char* name, std::uint64_t seq,
              std::chrono::milliseconds timeout = 10s) {
  auto c = std::make_shared<collective_call>();
  c->code = code;
  c->name = name;
  c->seq = seq;
  c->timeout = timeout;
  c->handle = work::make(name, "g");
  return c;
}

}  // namespace

TEST_CASE("device exchange: allreduce rounds in flight, every rank count, results exact") {
  host_ops ops;
  for (int n : {1, 2, 3, 4, 7}) {
    CAPTURE(n);
    ranks rk(n, ops, "exchange-allreduce-" + std::to_string(n));
    const int rounds = 40;
    std::vector<std::vector<call_ptr>> calls(static_cast<std::size_t>(rounds));
    std::vector<std::vector<ref::values>> inputs(static_cast<std::size_t>(rounds));
    // Post rank by rank (rank 0 posts every round before rank 1 posts any).
    for (int r = 0; r < n; ++r)
      for (int k = 0; k < rounds; ++k) {
        auto& in = inputs[static_cast<std::size_t>(k)];
        if (r == 0)
          for (int q = 0; q < n; ++q)
            in.push_back(ref::random_values(dtype::int64, 100 + k, std::uint64_t(q * 97 + k)));
        auto c = call(op_code::allreduce, "allreduce", std::uint64_t(k + 1));
        c->op = k % 2 ? reduce_op::MAX : reduce_op::SUM;
        c->input = c->output = ref::make(dtype::int64, in[static_cast<std::size_t>(r)]);
        calls[static_cast<std::size_t>(k)].push_back(c);
        rk.x->post(r, c, rk.queues[static_cast<std::size_t>(r)]);
      }
    for (int k = 0; k < rounds; ++k)
      for (int r = 0; r < n; ++r) {
        auto& c = calls[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)];
        c->handle.wait(10s);
        ref::check_close(c->output,
                         ref::reduce(inputs[static_cast<std::size_t>(k)], c->op, dtype::int64),
                         "round " + std::to_string(k) + " rank " + std::to_string(r));
      }
  }
  CHECK(ops.live == 0);  // every round released its events
}

TEST_CASE("device exchange: every collective family, with on_success run before completion") {
  host_ops ops;
  for (int n : {2, 3, 7}) {
    CAPTURE(n);
    ranks rk(n, ops, "exchange-families-" + std::to_string(n));
    std::vector<std::int64_t> counts;
    for (int r = 0; r < n; ++r) counts.push_back(r + 2);
    const auto total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
    std::vector<ref::values> in;
    for (int r = 0; r < n; ++r)
      in.push_back(ref::random_values(dtype::float64, total, std::uint64_t(r + 11)));
    std::atomic<int> unpacked{0};
    std::vector<call_ptr> bc, ag, rs, a2a;
    for (int r = 0; r < n; ++r) {
      auto q = rk.queues[static_cast<std::size_t>(r)];
      auto b = call(op_code::broadcast, "broadcast", 1);
      b->root = n - 1;
      b->input = b->output = ref::make(dtype::float64, in[static_cast<std::size_t>(r)]);
      b->on_success = [&] { ++unpacked; };
      bc.push_back(b);
      auto g = call(op_code::allgatherv, "allgatherv", 2);
      g->counts = counts;
      g->input = ref::make(dtype::float64, ref::values(in[static_cast<std::size_t>(r)].begin(),
                                                       in[static_cast<std::size_t>(r)].begin() +
                                                           counts[static_cast<std::size_t>(r)]));
      g->output = tensor::zeros({total}, dtype::float64);
      ag.push_back(g);
      auto s = call(op_code::reduce_scatterv, "reduce_scatterv", 3);
      s->op = reduce_op::AVG;
      s->counts = counts;
      s->input = ref::make(dtype::float64, in[static_cast<std::size_t>(r)]);
      s->output = tensor::zeros({counts[static_cast<std::size_t>(r)]}, dtype::float64);
      rs.push_back(s);
      auto a = call(op_code::alltoallv, "alltoall", 4);
      a->counts.assign(static_cast<std::size_t>(n), 1);
      a->recv_counts.assign(static_cast<std::size_t>(n), 1);
      a->input =
          ref::make(dtype::float64, ref::values(in[static_cast<std::size_t>(r)].begin(),
                                                in[static_cast<std::size_t>(r)].begin() + n));
      a->output = tensor::zeros({n}, dtype::float64);
      a2a.push_back(a);
    }
    // Ranks post in reverse order, each its four calls in sequence order.
    for (int r = n - 1; r >= 0; --r)
      for (auto* list : {&bc, &ag, &rs, &a2a})
        rk.x->post(r, (*list)[static_cast<std::size_t>(r)], rk.queues[static_cast<std::size_t>(r)]);
    for (auto* list : {&bc, &ag, &rs, &a2a})
      for (auto& c : *list) c->handle.wait(10s);
    CHECK(unpacked == n);
    auto avg = ref::reduce(in, reduce_op::AVG, dtype::float64);
    ref::values gathered;
    for (int r = 0; r < n; ++r)
      gathered.insert(
          gathered.end(), in[static_cast<std::size_t>(r)].begin(),
          in[static_cast<std::size_t>(r)].begin() + counts[static_cast<std::size_t>(r)]);
    std::int64_t off = 0;
    for (int r = 0; r < n; ++r) {
      const auto i = static_cast<std::size_t>(r);
      ref::check_close(bc[i]->output, in[static_cast<std::size_t>(n - 1)], "broadcast");
      ref::check_close(ag[i]->output, gathered, "allgatherv");
      ref::check_close(rs[i]->output, ref::values(avg.begin() + off, avg.begin() + off + counts[i]),
                       "reduce_scatterv AVG");
      off += counts[i];
      ref::values expected;
      for (int q = 0; q < n; ++q) expected.push_back(in[static_cast<std::size_t>(q)][i]);
      ref::check_close(a2a[i]->output, expected, "alltoall");
    }
  }
  CHECK(ops.live == 0);
}

TEST_CASE("device exchange: alltoall in place reads every block before a peer overwrites it") {
  // Rank r writes block r of rank j's buffer while rank j reads it: the
  // exchange copies an in-place input first (direct_plan.hpp).
  host_ops ops;
  for (int n : {2, 3, 4, 7}) {
    CAPTURE(n);
    ranks rk(n, ops, "exchange-alltoall-in-place-" + std::to_string(n));
    const std::int64_t len = 5;  // per pair
    auto value = [](int from, int to, std::int64_t i) { return double(from * 1000 + to * 10 + i); };
    std::vector<call_ptr> calls;
    for (int r = 0; r < n; ++r) {
      auto c = call(op_code::alltoallv, "alltoall_single", 1);
      c->counts.assign(static_cast<std::size_t>(n), len);
      c->recv_counts = c->counts;
      ref::values mine;
      for (int to = 0; to < n; ++to)
        for (std::int64_t i = 0; i < len; ++i) mine.push_back(value(r, to, i));
      c->input = c->output = ref::make(dtype::float64, mine);
      calls.push_back(c);
    }
    for (int r = 0; r < n; ++r)
      rk.x->post(r, calls[static_cast<std::size_t>(r)], rk.queues[static_cast<std::size_t>(r)]);
    for (int r = 0; r < n; ++r) {
      calls[static_cast<std::size_t>(r)]->handle.wait(10s);
      ref::values expected;
      for (int from = 0; from < n; ++from)
        for (std::int64_t i = 0; i < len; ++i) expected.push_back(value(from, r, i));
      ref::check_close(calls[static_cast<std::size_t>(r)]->output, expected,
                       "alltoall_single in place");
    }
  }
  CHECK(ops.live == 0);
}

TEST_CASE("device exchange: a rank that never posts times out every posted rank, naming it") {
  host_ops ops;
  ranks rk(3, ops, "exchange-timeout");
  std::vector<call_ptr> calls;
  for (int r = 0; r < 2; ++r) {
    calls.push_back(call(op_code::allreduce, "allreduce", 1, 200ms));
    calls.back()->input = calls.back()->output = tensor::zeros({4}, dtype::float32);
    rk.x->post(r, calls.back(), rk.queues[static_cast<std::size_t>(r)]);
  }
  for (auto& c : calls)
    check_error(
        [&] { c->handle.wait(5s); }, errc::timeout,
        {"allreduce: Timed out after 200 ms waiting for rank 2 to join", "sequence number 1"});
  // Joining late fails at once with the same reason; the next round works.
  auto late = call(op_code::allreduce, "allreduce", 1);
  late->input = late->output = tensor::zeros({4}, dtype::float32);
  rk.x->post(2, late, rk.queues[2]);
  check_error([&] { late->handle.wait(1s); }, errc::timeout, {"waiting for rank 2"});
  std::vector<call_ptr> next;
  for (int r = 0; r < 3; ++r) {
    next.push_back(call(op_code::allreduce, "allreduce", 2));
    next.back()->input = next.back()->output = tensor::from_vector<float>({float(r)});
    rk.x->post(r, next.back(), rk.queues[static_cast<std::size_t>(r)]);
  }
  for (auto& c : next) {
    c->handle.wait(5s);
    CHECK(c->output.to_vector<float>()[0] == 3.0f);
  }
  CHECK(ops.live == 0);
}

TEST_CASE("device exchange: calls that disagree fail on every rank, and the next round works") {
  host_ops ops;
  ranks rk(2, ops, "exchange-mismatch");
  auto a = call(op_code::allreduce, "allreduce", 1);
  a->input = a->output = tensor::zeros({4}, dtype::float32);
  auto b = call(op_code::broadcast, "broadcast", 1);
  b->input = b->output = tensor::zeros({4}, dtype::float32);
  rk.x->post(0, a, rk.queues[0]);
  rk.x->post(1, b, rk.queues[1]);
  for (auto& c : {a, b})
    check_error([&] { c->handle.wait(5s); }, errc::mismatch,
                {"collective mismatch", "rank 1 called broadcast", "rank 0 called allreduce"});
  auto c0 = call(op_code::allreduce, "allreduce", 2), c1 = call(op_code::allreduce, "allreduce", 2);
  c0->input = c0->output = tensor::zeros({4}, dtype::float32);
  c1->input = c1->output = tensor::zeros({5}, dtype::float32);
  rk.x->post(0, c0, rk.queues[0]);
  rk.x->post(1, c1, rk.queues[1]);
  for (auto& c : {c0, c1})
    check_error([&] { c->handle.wait(5s); }, errc::mismatch,
                {"collective mismatch", "rank 1 called allreduce (SUM) of 5 float32 elements",
                 "the element count"});
  CHECK(ops.live == 0);
}

TEST_CASE("device exchange: a failing kernel fails the round on every rank") {
  host_ops ops;
  ranks rk(3, ops, "exchange-kernel-failure");
  std::vector<call_ptr> calls;
  for (int r = 0; r < 3; ++r) {
    calls.push_back(call(op_code::allgatherv, "allgather", 1));
    calls.back()->counts = {1, 1, 1};
    calls.back()->input = tensor::from_vector<float>({float(r)});
    calls.back()->output = tensor::zeros({3}, dtype::float32);
  }
  ops.poisoned = calls[1]->input.data();  // rank 1's share fails
  for (int r = 0; r < 3; ++r)
    rk.x->post(r, calls[static_cast<std::size_t>(r)], rk.queues[static_cast<std::size_t>(r)]);
  for (auto& c : calls)
    check_error([&] { c->handle.wait(5s); }, errc::backend,
                {"allgather: cuda:1: reduce_kernel failed"});
}

TEST_CASE("device exchange: devices that cannot reach each other fail every rank") {
  host_ops ops;
  ops.separate_devices = true;
  ranks rk(2, ops, "exchange-devices");  // rank r's queue is on device r % 2
  std::vector<call_ptr> calls;
  for (int r = 0; r < 2; ++r) {
    calls.push_back(call(op_code::allreduce, "allreduce", 1));
    calls.back()->input = calls.back()->output = tensor::zeros({2}, dtype::float32);
    rk.x->post(r, calls.back(), rk.queues[static_cast<std::size_t>(r)]);
  }
  for (auto& c : calls)
    check_error([&] { c->handle.wait(5s); }, errc::invalid_argument,
                {"allreduce: cuda:0 cannot reach cuda:1"});
  CHECK(ops.live == 0);
}

TEST_CASE("device exchange: a rank that leaves fails the calls waiting for it; abort fails all") {
  host_ops ops;
  ranks rk(3, ops, "exchange-leave");
  auto waiting = call(op_code::allreduce, "allreduce", 1);
  waiting->input = waiting->output = tensor::zeros({2}, dtype::float32);
  rk.x->post(0, waiting, rk.queues[0]);
  rk.x->leave(2, "the group was destroyed");
  check_error([&] { waiting->handle.wait(5s); }, errc::peer_failure,
              {"allreduce failed: a rank of the group left: rank 2 (the group was destroyed)"});
  auto later = call(op_code::allreduce, "allreduce", 2);
  later->input = later->output = tensor::zeros({2}, dtype::float32);
  rk.x->post(1, later, rk.queues[1]);
  check_error([&] { later->handle.wait(5s); }, errc::peer_failure, {"rank 2"});

  ranks other(2, ops, "exchange-abort");
  auto pending = call(op_code::allreduce, "allreduce", 1);
  pending->input = pending->output = tensor::zeros({2}, dtype::float32);
  other.x->post(0, pending, other.queues[0]);
  other.x->abort("the user said so");
  check_error([&] { pending->handle.wait(5s); }, errc::aborted, {"the user said so"});
  auto after = call(op_code::allreduce, "allreduce", 2);
  after->input = after->output = tensor::zeros({2}, dtype::float32);
  other.x->post(1, after, other.queues[1]);
  check_error([&] { after->handle.wait(5s); }, errc::aborted,
              {"allreduce failed: the user said so"});
}
