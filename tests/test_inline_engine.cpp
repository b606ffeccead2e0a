// The inline engine on the shared segment (inline/shm/): allreduce for groups whose ranks share
// a host. Results across the small/chunked boundaries, bytes copied per byte
// reduced, progress without a waiting thread, issue from one thread for
// every rank, timeouts, a rank that leaves, abort, TROUPE_ENGINE=actors, and
// outputs streamed past the caches (kernels/stream_copy.hpp).

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "../inline/engine.hpp"
#include "../inline/medium.hpp"
#include "../inline/shm/segment.hpp"
#include "../kernels/stream_copy.hpp"
#include "check_error.hpp"
#include "collective_test.hpp"
#include "make_worlds.hpp"
#include "scoped_env.hpp"
#include "troupe/troupe.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::test::check_error;

// The cases are about the inline engine on the shared segment: they run on
// it whatever TROUPE_ENGINE or TROUPE_FABRIC says (a case that wants
// another engine sets it).
const troupe::test::scoped_env on_the_inline_engine{"TROUPE_ENGINE", "inline"};

namespace {

std::uint64_t reduced_so_far() {
  return detail::inline_stats().reduced.load();
}

using troupe::test::make_worlds;

template <class T = float>
tensor filled(std::int64_t len, T v) {
  return tensor::from_vector(std::vector<T>(static_cast<std::size_t>(len), v));
}

}  // namespace

/// Runs the test body with ranks of one process reading each other's buffers
/// (direct) and staging through the segment as separate processes do,
/// whatever engine the environment asks for.
struct engine_mode {
  explicit engine_mode(bool staged) : env{"TROUPE_ENGINE", staged ? "staged" : "inline"} {}
  troupe::test::scoped_env env;
};

TEST_CASE("inline allreduce matches the reference across the small and chunked paths") {
  for (bool staged : {false, true}) {
    CAPTURE(staged);
    engine_mode mode{staged};
    for (int n : {2, 3, 4, 7}) {
      CAPTURE(n);
      const auto shape = detail::shape_for(n);
      const auto small = static_cast<std::int64_t>(shape.small_bytes / 4);
      const auto chunk = static_cast<std::int64_t>(shape.chunk_bytes / 4);
      // 0, 1, the largest one-step size and one above, exactly one chunk, a
      // ragged tail, and more chunks than staging slots (the ring wraps).
      const std::int64_t lens[] = {
          0, 1, small, small + 1, chunk, chunk + 17, chunk * (shape.chunk_slots * 2 + 1) + 5};
      const auto before = reduced_so_far();
      testing::run_ranks(n, [&](world& w) {
        auto& pg = w.default_group();
        for (auto len : lens)
          for (auto op :
               {reduce_op(reduce_op::SUM), reduce_op(reduce_op::MAX), reduce_op(reduce_op::AVG)}) {
            const auto e = ct::expected_for(dtype::float32, op, n, len, int(len % 97));
            auto x = ref::make(dtype::float32, e->input(w.rank()));
            pg.allreduce(x, op).wait();
            ref::check_close(
                x, e->result,
                ct::name("inline allreduce", dtype::float32, len) + " " + op.to_string());
          }
        // Integers: exact, and MIN over a chunked buffer.
        const auto ints = ct::expected_for(dtype::int64, reduce_op::MIN, n, chunk + 3, 5);
        auto y = ref::make(dtype::int64, ints->input(w.rank()));
        pg.allreduce(y, reduce_op::MIN).wait();
        ref::check_close(y, ints->result, "inline MIN int64");
      });
      CHECK(reduced_so_far() > before);  // the inline engine ran them
    }
  }
}

TEST_CASE("inline allreduce copies one or two bytes per byte reduced, nothing more") {
  // Staged (ranks in separate processes): stage (n-1)/n, own part 1/n, gather
  // (n-1)/n: (2n-1)/n·N per rank; with 2 ranks each stages its whole buffer
  // and reduces the other's copy in place: N. Direct (one process): each rank
  // writes its reduced part into the n-1 other buffers: (n-1)/n·N. No
  // messages, no private copies.
  for (bool staged : {false, true})
    for (int n : {2, 4}) {
      engine_mode mode{staged};
      const std::int64_t len = 4 << 20;  // 16 MiB of float32
      const auto copied0 = detail::inline_stats().copied.load();
      const auto reduced0 = detail::inline_stats().reduced.load();
      testing::run_ranks(n, [&](world& w) {
        auto x = filled<float>(len, 1.0f);
        w.default_group().allreduce(x).wait();
        CHECK(x.to_vector<float>()[static_cast<std::size_t>(len - 1)] == float(n));
      });
      const auto copied = detail::inline_stats().copied.load() - copied0;
      const auto reduced = detail::inline_stats().reduced.load() - reduced0;
      CAPTURE(staged);
      CAPTURE(n);
      CAPTURE(copied);
      CHECK(reduced == static_cast<std::uint64_t>(n * len * 4));
      const double per_byte = double(copied) / double(reduced);
      const double expected = staged ? (n == 2 ? 1.0 : double(2 * n - 1) / n) : double(n - 1) / n;
      CHECK(per_byte <= expected + 0.01);
      CHECK(per_byte >= expected - 0.01);
    }
}

TEST_CASE("inline allreduce completes and runs callbacks although nobody waits") {
  testing::run_ranks(3, [](world& w) {
    auto x = filled<float>(100000, 2.0f);
    std::promise<bool> done;
    auto wk = w.default_group().allreduce(x);
    wk.on_complete([&](const work& d) { done.set_value(d.is_success()); });
    auto f = done.get_future();
    REQUIRE(f.wait_for(20s) == std::future_status::ready);  // the watchdog moved it
    CHECK(f.get());
    CHECK(x.to_vector<float>()[99999] == 6.0f);
  });
}

TEST_CASE("one thread can issue the allreduce of every rank, then wait") {
  auto ws = make_worlds(4);
  std::vector<tensor> xs;
  std::vector<work> wks;
  for (int r = 0; r < 4; ++r) {
    xs.push_back(filled<float>(70000, float(r + 1)));
    wks.push_back(ws[static_cast<std::size_t>(r)]->default_group().allreduce(xs.back()));
  }
  for (auto& wk : wks) wk.wait(20s);
  for (auto& x : xs) CHECK(x.to_vector<float>()[69999] == 10.0f);
  // And the small path, waiting in reverse order.
  wks.clear();
  for (int r = 0; r < 4; ++r) {
    xs[static_cast<std::size_t>(r)] = filled<std::int32_t>(3, std::int32_t{1});
    wks.push_back(ws[static_cast<std::size_t>(r)]->default_group().allreduce(
        xs[static_cast<std::size_t>(r)]));
  }
  for (int r = 3; r >= 0; --r) wks[static_cast<std::size_t>(r)].wait(20s);
  for (auto& x : xs) CHECK(x.to_vector<std::int32_t>()[2] == 4);
}

TEST_CASE("an inline allreduce a peer never joins times out, and the engine stops") {
  auto ws = make_worlds(2);
  auto x = filled<float>(8, 1.0f);
  auto& pg = ws[0]->default_group();
  const auto t0 = std::chrono::steady_clock::now();
  check_error([&] { pg.allreduce(tensor_list{x}, {.timeout = 300ms}).wait(); }, errc::timeout,
              {"allreduce", "group", "Timed out after 300 ms", "rank 1", "issue this allreduce"});
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  // The peers' protocol states now differ: later calls fail at once, naming why.
  check_error([&] { pg.allreduce(tensor_list{x}, {.timeout = 300ms}).wait(); }, errc::aborted,
              {"allreduce", "stopped after an earlier failure", "Timed out after 300 ms"});
}

TEST_CASE("a rank that leaves fails the inline allreduce waiting for it, at once") {
  auto ws = make_worlds(3);
  auto x = filled<float>(200000, 1.0f);
  auto wk = ws[0]->default_group().allreduce(tensor_list{x}, {.timeout = 20s});
  const auto t0 = std::chrono::steady_clock::now();
  ws[2].reset();  // rank 2 destroys its world without joining
  check_error([&] { wk.wait(); }, errc::peer_failure, {"allreduce", "rank 2", "left group"});
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  ws[1]->abort("test over");
}

TEST_CASE("abort fails a pending inline allreduce") {
  auto ws = make_worlds(2);
  auto x = filled<float>(5, 1.0f);
  auto wk = ws[1]->default_group().allreduce(tensor_list{x}, {.timeout = 20s});
  ws[1]->abort("stopped by the test");
  check_error([&] { wk.wait(); }, errc::aborted, {"allreduce", "stopped by the test"});
}

TEST_CASE("TROUPE_ENGINE=actors keeps allreduce on the actor path") {
  const auto before = reduced_so_far();
  {
    troupe::test::scoped_env actors{"TROUPE_ENGINE", "actors"};
    testing::run_ranks(2, [](world& w) {
      auto x = filled<float>(1000, 1.0f);
      w.default_group().allreduce(x).wait();
      CHECK(x.to_vector<float>()[999] == 2.0f);
    });
  }
  CHECK(reduced_so_far() == before);
}

TEST_CASE("outputs streamed past the caches arrive byte for byte") {
  // Streaming (non-temporal stores) starts where the host's outputs outgrow
  // the last-level cache; here at once, so that every size and alignment
  // goes through it: blocks of 12345 bytes start anywhere in a cache line.
  detail::set_stream_threshold(1);
  for (bool staged : {false, true}) {
    CAPTURE(staged);
    engine_mode mode{staged};
    for (int n : {2, 3, 4}) {
      CAPTURE(n);
      testing::run_ranks(n, [&](world& w) {
        auto& pg = w.default_group();
        const int me = w.rank();
        const std::int64_t len = 12345;
        auto byte_of = [](int r, std::int64_t i) { return std::uint8_t((r * 131 + i * 7) & 0xff); };
        auto in = tensor::empty({len * n}, dtype::uint8);
        for (std::int64_t i = 0; i < len * n; ++i) in.data_as<std::uint8_t>()[i] = byte_of(me, i);
        // allgather: rank r's first len bytes in block r.
        auto mine = in.flat_slice(0, len);
        auto gathered = tensor::empty({len * n}, dtype::uint8);
        pg.allgather_into_tensor(gathered, mine).wait();
        // alltoall: block r of rank s's input is block s of rank r's output.
        auto swapped = tensor::empty({len * n}, dtype::uint8);
        pg.alltoall_single(swapped, in).wait();
        // broadcast from the last rank.
        auto b = in.clone();
        pg.broadcast(b, n - 1).wait();
        bool ok = true;
        for (int r = 0; r < n; ++r)
          for (std::int64_t i = 0; i < len; ++i) {
            ok &= gathered.data_as<std::uint8_t>()[r * len + i] == byte_of(r, i);
            ok &= swapped.data_as<std::uint8_t>()[r * len + i] == byte_of(r, me * len + i);
            ok &= b.data_as<std::uint8_t>()[r * len + i] == byte_of(n - 1, r * len + i);
          }
        CHECK(ok);
      });
    }
  }
  detail::set_stream_threshold(0);
}

TEST_CASE("stream_copy copies exactly what memcpy does, at every alignment") {
  std::vector<std::uint8_t> src(4096 + 64), dst(4096 + 128), want(4096 + 128);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = std::uint8_t(i * 13 + 1);
  for (std::size_t d = 0; d < 64; d += 7)
    for (std::size_t s = 0; s < 64; s += 5)
      for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{63}, std::size_t{64},
                              std::size_t{65}, std::size_t{200}, std::size_t{4096}}) {
        std::fill(dst.begin(), dst.end(), 0xee);
        want = dst;
        std::memcpy(want.data() + d, src.data() + s, len);
        detail::stream_copy(dst.data() + d, src.data() + s, len);
        detail::stream_fence();
        CHECK_MESSAGE(dst == want,
                      "dst offset " << d << ", src offset " << s << ", " << len << " bytes");
      }
  CHECK(detail::last_level_cache_bytes() > 0);
  CHECK(detail::stream_threshold() == detail::last_level_cache_bytes());
}

// -- any exception an operation throws fails its work ------------------------

namespace {

/// A medium of one rank: nothing to wait for.
class lone_medium final : public detail::medium {
 public:
  int size() const noexcept override { return 1; }
  void sleep(int, std::chrono::nanoseconds max, const std::function<bool()>& recheck,
             detail::reading) override {
    if (!recheck()) std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(max, 1ms));
  }
  std::string lost(std::uint64_t, int, std::chrono::steady_clock::time_point) override {
    return {};
  }
  void wake_all() override {}
  void leave() override {}
};

/// An operation that throws `what` when stepped.
template <class E>
class throwing_op final : public detail::inline_op {
 public:
  explicit throwing_op(E e) : e_(std::move(e)) {}
  bool step(detail::inline_context&, bool&) override { throw e_; }
  std::pair<int, std::string> blocker() const override { return {-1, "nothing"}; }

 private:
  E e_;
};

template <class E>
work submit_throwing(detail::inline_engine& f, E e) {
  auto op = std::make_unique<throwing_op<E>>(std::move(e));
  op->name = "allreduce";
  op->timeout = 5s;
  op->handle = work::make("allreduce", "g");
  op->op = f.next_op();
  return f.submit(std::move(op));
}

}  // namespace

TEST_CASE("an operation that throws bad_alloc or anything else fails its work, not the process") {
  auto f = std::make_shared<detail::inline_engine>(std::make_shared<lone_medium>(), 0, "g",
                                                   std::vector<std::string>{"rank 0"});
  // Submitting steps the operation at once: the work fails, nothing escapes.
  auto a = submit_throwing(*f, std::bad_alloc{});
  check_error([&] { a.wait(); }, errc::internal, {"allreduce on group 'g'", "internal error"});
  // The engine stopped (the protocol state is unknown): later calls say why.
  auto b = submit_throwing(*f, 42);
  check_error([&] { b.wait(); }, errc::aborted, {"earlier failure"});
}
