// troupe::work: waiting, status, failures of real collectives, then() chains,
// when_all, on_complete, the factories, source_rank, and awaiting a work from
// inside a CAF actor without blocking it (<troupe/caf_await.hpp>).

#include <doctest/doctest.h>
#include "check_error.hpp"
#include "scoped_env.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <initializer_list>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <troupe/caf_await.hpp>

#include "base/futex_lock.hpp"
#include "base/work_state.hpp"
#include "inline/progress.hpp"
#include "kernels/shared_copy.hpp"
#include "memory/recycled.hpp"
#include "troupe/error.hpp"
#include "troupe/testing.hpp"
#include "troupe/work.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using troupe::test::check_error;
using namespace std::chrono_literals;

namespace {

std::exception_ptr some_error(const std::string& what, errc code = errc::internal) {
  return std::make_exception_ptr(error(code, what));
}

float first(const tensor_list& ts) {
  return ts.at(0).to_vector<float>().at(0);
}

tensor_list one(float x) {
  return {tensor::from_vector<float>({x})};
}

}  // namespace

// -- waiting and status ---------------------------------------------------------------------

TEST_CASE("wait(timeout) on a work that never completes throws errc::timeout") {
  auto w = work::make("allreduce", "g7", 3);
  const auto start = std::chrono::steady_clock::now();
  check_error([&] { w.wait(50ms); }, errc::timeout,
              {"Timed out", "50 ms", "allreduce on group 'g7'", "seq 3"});
  CHECK(std::chrono::steady_clock::now() - start >= 50ms);
  CHECK_FALSE(w.is_completed());  // the operation keeps running
  w.complete(one(1));
  w.wait(50ms);  // waiting again succeeds
}

TEST_CASE("a pending work reports its status") {
  auto w = work::make("broadcast", "default");
  CHECK(w.valid());
  CHECK_FALSE(w.is_completed());
  CHECK_FALSE(w.is_success());
  CHECK(w.exception() == nullptr);
  CHECK(w.source_rank() == -1);
  CHECK(w.sequence_number() == 0);
  CHECK(w.op_name() == "broadcast");
  CHECK(w.group_name() == "default");
  w.set_sequence_number(9);
  CHECK(w.sequence_number() == 9);
}

TEST_CASE("a completed work reports its outputs") {
  auto w = work::make("allreduce", "default");
  w.complete(one(5));
  CHECK(w.is_completed());
  CHECK(w.is_success());
  CHECK(w.exception() == nullptr);
  w.wait();
  CHECK(first(w.result()) == 5.0f);
  w.complete(one(6));  // first call wins
  w.fail(some_error("late"));
  CHECK(w.is_success());
  CHECK(first(w.result()) == 5.0f);
}

TEST_CASE("a failed work rethrows its error from wait and result") {
  auto w = work::make("allreduce", "default");
  w.fail(some_error("the cause", errc::peer_failure));
  CHECK(w.is_completed());
  CHECK_FALSE(w.is_success());
  REQUIRE(w.exception() != nullptr);
  check_error([&] { w.wait(); }, errc::peer_failure, {"the cause"});
  check_error([&] { w.wait(10ms); }, errc::peer_failure, {"the cause"});
  check_error([&] { (void)w.result(); }, errc::peer_failure, {"the cause"});
  w.complete(one(1));  // ignored
  CHECK_FALSE(w.is_success());
}

TEST_CASE("wait unblocks when another thread completes the work") {
  auto w = work::make("op", "g");
  std::thread t{[w] {
    std::this_thread::sleep_for(20ms);
    w.complete(one(3));
  }};
  w.wait();
  CHECK(first(w.result()) == 3.0f);
  t.join();
}

TEST_CASE("a default-constructed work is not attached to anything") {
  work w;
  CHECK_FALSE(w.valid());
  check_error([&] { w.wait(); }, errc::invalid_argument, {"not attached"});
  check_error([&] { (void)w.is_completed(); }, errc::invalid_argument, {"not attached"});
}

TEST_CASE("work::completed and work::failed") {
  auto ok = work::completed("barrier", "grp", one(2));
  CHECK(ok.is_completed());
  CHECK(ok.is_success());
  CHECK(ok.op_name() == "barrier");
  CHECK(ok.group_name() == "grp");
  CHECK(first(ok.result()) == 2.0f);

  auto bad = work::failed("send", "grp", some_error("boom", errc::backend));
  CHECK(bad.is_completed());
  CHECK_FALSE(bad.is_success());
  CHECK(bad.op_name() == "send");
  check_error([&] { bad.wait(); }, errc::backend, {"boom"});
}

// -- failures of real operations -----------------------------------------------------------------

TEST_CASE("a collective that times out names the op, group, sequence number and cause") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    if (w.rank() == 1) return;  // never joins the barrier
    auto b = pg.barrier({.timeout = 300ms});
    const auto start = std::chrono::steady_clock::now();
    check_error([&] { b.wait(); }, errc::timeout,
                {"barrier", "group 'default'", "seq 1", "Timed out after 300 ms", "rank 1"});
    CHECK(std::chrono::steady_clock::now() - start < 10s);
    CHECK(b.is_completed());
    CHECK_FALSE(b.is_success());
    CHECK(b.sequence_number() == 1);
  });
}

TEST_CASE("a receive that times out names the op, group, peer and tag") {
  testing::run_ranks(2, [](world& w) {
    if (w.rank() == 1) return;  // never sends
    auto t = tensor::zeros({2}, dtype::float32);
    auto r = w.default_group().recv(tensor_list{t}, 1, p2p_options{.tag = 7, .timeout = 400ms});
    check_error([&] { r.wait(); }, errc::timeout,
                {"recv", "group 'default'", "Timed out after 400 ms", "rank 1", "tag 7"});
  });
}

TEST_CASE("a successful collective's work carries op, group and sequence number") {
  testing::run_ranks(2, [](world& w) {
    auto t = tensor::from_vector<float>({1.0f});
    auto wk = w.default_group().allreduce(t);
    CHECK(wk.op_name() == "allreduce");
    CHECK(wk.group_name() == "default");
    auto out = wk.result();
    REQUIRE(out.size() == 1);
    CHECK(out[0].is_same(t));
    CHECK(t.to_vector<float>()[0] == 2.0f);
    CHECK(wk.sequence_number() == 1);
  });
}

TEST_CASE("recv_any_source reports the sender in source_rank") {
  testing::run_ranks(3, [](world& w) {
    auto& pg = w.default_group();
    if (w.rank() == 0) {
      auto a = tensor::zeros({1}, dtype::int32);
      auto wa = pg.recv_any_source(a, 5);
      wa.wait();
      CHECK(wa.source_rank() == 2);
      CHECK(a.to_vector<std::int32_t>()[0] == 20);
      pg.send(tensor::from_vector<std::int32_t>({0}), 1, 6).wait();  // rank 1 may send now
      auto b = tensor::zeros({1}, dtype::int32);
      auto wb = pg.recv_any_source(b, 6);
      wb.wait();
      CHECK(wb.source_rank() == 1);
      CHECK(b.to_vector<std::int32_t>()[0] == 10);
    } else if (w.rank() == 1) {
      auto go = tensor::zeros({1}, dtype::int32);
      pg.recv(go, 0, 6).wait();
      pg.send(tensor::from_vector<std::int32_t>({10}), 0, 6).wait();
    } else {
      pg.send(tensor::from_vector<std::int32_t>({20}), 0, 5).wait();
    }
  });
}

TEST_CASE("source_rank is -1 for collectives") {
  testing::run_ranks(2, [](world& w) {
    auto t = tensor::zeros({1}, dtype::float32);
    auto a = w.default_group().allreduce(t);
    a.wait();
    CHECK(a.source_rank() == -1);
  });
}

// -- then
// -----------------------------------------------------------------------------------------------

TEST_CASE("then chains two levels") {
  auto w = work::make("allreduce", "g");
  auto plus_one = [](const work& done) { return one(first(done.result()) + 1); };
  auto w2 = w.then(plus_one);
  auto w3 = w2.then([](const work& done) { return one(first(done.result()) * 10); });
  CHECK_FALSE(w2.is_completed());
  CHECK_FALSE(w3.is_completed());
  w.complete(one(1));
  CHECK(first(w2.result()) == 2.0f);
  CHECK(first(w3.result()) == 20.0f);
  CHECK(w3.group_name() == "g");
}

TEST_CASE("then on an already completed work runs at once") {
  auto w = work::completed("broadcast", "g", one(4));
  bool ran = false;
  auto w2 = w.then([&](const work& done) {
    ran = true;
    return done.result();
  });
  CHECK(ran);
  CHECK(w2.is_completed());
  CHECK(first(w2.result()) == 4.0f);
}

TEST_CASE("then whose callback throws fails the chained work with that exception") {
  auto w = work::make("allreduce", "g");
  auto w2 = w.then([](const work&) -> tensor_list {
    throw error(errc::invalid_argument, "callback refused the outputs");
  });
  w.complete(one(1));
  CHECK(w.is_success());
  CHECK(w2.is_completed());
  check_error([&] { w2.wait(); }, errc::invalid_argument, {"callback refused the outputs"});

  auto w3 = work::completed("x", "g", {}).then([](const work&) -> tensor_list {
    throw std::runtime_error("plain exception");
  });
  REQUIRE(w3.exception() != nullptr);
  CHECK_THROWS_WITH_AS(w3.wait(), "plain exception", std::runtime_error);
}

TEST_CASE("then on a failed work: a callback that rethrows passes the error on") {
  auto w = work::make("allreduce", "g");
  auto w2 = w.then([](const work& done) {
    done.wait();  // rethrows
    return done.result();
  });
  auto w3 =
      w2.then([](const work& done) -> tensor_list { std::rethrow_exception(done.exception()); });
  w.fail(some_error("allreduce on group 'g' failed: peer left", errc::peer_failure));
  check_error([&] { w2.wait(); }, errc::peer_failure, {"peer left"});
  check_error([&] { w3.wait(); }, errc::peer_failure, {"peer left"});
}

TEST_CASE("then on a failed work: a callback may recover") {
  auto w = work::failed("recv", "g", some_error("lost"));
  auto w2 = w.then([](const work& done) {
    CHECK_FALSE(done.is_success());
    return one(-1);
  });
  CHECK(w2.is_success());
  CHECK(first(w2.result()) == -1.0f);
}

TEST_CASE("then on a real collective") {
  testing::run_ranks(2, [](world& w) {
    auto t = tensor::from_vector<float>({static_cast<float>(w.rank() + 1)});
    auto doubled = w.default_group().allreduce(t).then([](const work& done) {
      auto out = done.result();
      auto r = out[0].clone();
      r.data_as<float>()[0] *= 2;
      return tensor_list{r};
    });
    CHECK(first(doubled.result()) == 6.0f);
  });
}

// -- when_all
// -------------------------------------------------------------------------------------------

TEST_CASE("when_all completes when every part did, with their outputs in order") {
  auto a = work::make("send", "g");
  auto b = work::make("recv", "g");
  auto c = work::make("recv", "g");
  auto all = work::when_all("batch", "g", {a, b, c});
  c.complete(one(3));
  a.complete(one(1));
  CHECK_FALSE(all.is_completed());
  b.complete(one(2));
  REQUIRE(all.is_completed());
  auto out = all.result();
  REQUIRE(out.size() == 3);
  CHECK(first({out[0]}) == 1.0f);
  CHECK(first({out[1]}) == 2.0f);
  CHECK(first({out[2]}) == 3.0f);
  CHECK(all.op_name() == "batch");
}

TEST_CASE("when_all fails with the first failure") {
  auto a = work::make("send", "g");
  auto b = work::make("recv", "g");
  auto all = work::when_all("batch", "g", {a, b});
  b.fail(some_error("recv broke", errc::timeout));
  CHECK(all.is_completed());
  check_error([&] { all.wait(); }, errc::timeout, {"recv broke"});
  a.fail(some_error("send broke"));
  check_error([&] { all.wait(); }, errc::timeout, {"recv broke"});
}

TEST_CASE("when_all whose parts complete on many threads at once completes once, in order") {
  for (int round = 0; round < 200; ++round) {
    std::vector<work> parts;
    for (int i = 0; i < 8; ++i) parts.push_back(work::make("recv", "g"));
    auto all = work::when_all("batch", "g", parts);
    std::atomic<int> called{0};
    all.on_complete([&](const work&) { ++called; });
    std::vector<std::thread> ts;
    for (int i = 0; i < 8; ++i)
      ts.emplace_back([&, i] { parts[static_cast<std::size_t>(i)].complete(one(float(i))); });
    for (auto& t : ts) t.join();
    REQUIRE(all.is_success());
    auto out = all.result();
    REQUIRE(out.size() == 8);
    for (int i = 0; i < 8; ++i) CHECK(first({out[static_cast<std::size_t>(i)]}) == float(i));
    CHECK(called.load() == 1);
  }
}

TEST_CASE("when_all with a part failing while the others complete fails with that failure") {
  for (int round = 0; round < 200; ++round) {
    std::vector<work> parts;
    for (int i = 0; i < 4; ++i) parts.push_back(work::make("recv", "g"));
    auto all = work::when_all("batch", "g", parts);
    std::vector<std::thread> ts;
    for (int i = 0; i < 4; ++i)
      ts.emplace_back([&, i] {
        if (i == 2)
          parts[2].fail(some_error("part 2 broke", errc::timeout));
        else
          parts[static_cast<std::size_t>(i)].complete(one(1));
      });
    for (auto& t : ts) t.join();
    check_error([&] { all.wait(); }, errc::timeout, {"part 2 broke"});
  }
}

TEST_CASE("when_all: the whole may be dropped before its parts complete, and a part may join two") {
  auto a = work::make("send", "g");
  auto b = work::make("recv", "g");
  std::atomic<int> seen{0};
  {
    auto dropped = work::when_all("batch", "g", {a, b});
    dropped.on_complete([&](const work& w) { seen += w.is_success() ? 1 : 100; });
  }
  auto kept = work::when_all("batch", "g", {b});
  a.complete(one(1));
  CHECK_FALSE(kept.is_completed());
  b.complete(one(2));
  CHECK(seen.load() == 1);
  REQUIRE(kept.is_success());
  CHECK(first(kept.result()) == 2.0f);
  // Parts done before the call: the whole is complete when it returns.
  CHECK(work::when_all("batch", "g", {a, b}).is_success());
}

TEST_CASE("when_all of nothing completes at once") {
  auto all = work::when_all("coalesced", "g", {});
  CHECK(all.is_success());
  CHECK(all.result().empty());
}

// -- on_complete
// ----------------------------------------------------------------------------------------

TEST_CASE("on_complete runs exactly once") {
  auto w = work::make("op", "g");
  std::atomic<int> calls{0};
  w.on_complete([&](const work& done) {
    CHECK(done.is_completed());
    ++calls;
  });
  CHECK(calls == 0);
  w.complete(one(1));
  w.complete(one(2));
  w.fail(some_error("late"));
  CHECK(calls == 1);
  int later = 0;
  w.on_complete([&](const work&) { ++later; });  // already done: runs right away
  CHECK(later == 1);
}

TEST_CASE("on_complete runs once when completion races with registration") {
  for (int i = 0; i < 50; ++i) {
    auto w = work::make("op", "g");
    std::atomic<int> calls{0};
    std::thread t{[w] { w.complete({}); }};
    w.on_complete([&](const work&) { ++calls; });
    t.join();
    CHECK(calls == 1);
  }
}

TEST_CASE("an exception from an on_complete callback stays with the callback") {
  // Registered before completion: the completing call does not throw, later
  // callbacks still run, and the work keeps its own outcome.
  auto w = work::make("op", "g");
  int after = 0;
  w.on_complete([](const work&) { throw std::runtime_error("callback failed"); });
  w.on_complete([&](const work&) { ++after; });
  CHECK_NOTHROW(w.complete(one(1)));
  CHECK(after == 1);
  CHECK(w.is_success());
  CHECK(first(w.result()) == 1.f);
  // Registered after completion: on_complete itself does not throw.
  CHECK_NOTHROW(w.on_complete([](const work&) { throw 42; }));
  // then(): the chained work fails with what its function threw, the
  // original work does not.
  auto next = w.then([](const work&) -> tensor_list { throw std::runtime_error("then failed"); });
  CHECK_THROWS_WITH(next.wait(), "then failed");
  CHECK(w.is_success());
}

TEST_CASE("waiting on a then() continuation drives the operation it continues") {
  // An inline operation moves in the thread that waits for it: the
  // continuation's wait must drive it (else it moves on the watchdog's tick).
  // About the inline engine: it runs on it whatever TROUPE_ENGINE or
  // TROUPE_FABRIC says.
  troupe::test::scoped_env engine{"TROUPE_ENGINE", "inline"};
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    for (int i = 0; i < 10; ++i) {
      auto t = tensor::from_vector<float>({1.f});
      auto parent = pg.allreduce(t);
      auto next = parent.then([](const work& done) { return done.result(); });
      REQUIRE(parent.state()->driver);
      CHECK(next.state()->driver);
      CHECK(first(next.result()) == 2.f);
    }
  });
}

TEST_CASE("collectives chained by on_complete progress with no thread waiting") {
  // Each next allreduce is issued from the previous one's on_complete and no
  // thread waits on a work: the inline engine's progress thread drives them
  // (they used to move on its 1 ms tick only: 400 calls took at least 400 ms).
  // The ticker's period is an hour here: a chain that waited for a tick
  // would not end. On 1, 2, 3 and 4 ranks, every value checked.
  const auto period = detail::set_tick_period(std::chrono::hours(1));
  struct restore {
    std::chrono::milliseconds p;
    ~restore() { detail::set_tick_period(p); }
  } restore_period{period};
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      constexpr int calls = 400;
      auto t = tensor::from_vector<float>({float(w.rank())});
      std::mutex m;
      std::condition_variable cv;
      int left = calls;
      bool wrong = false;
      std::function<void(const work&)> next = [&](const work& done) {
        bool last = false;
        {
          std::lock_guard<std::mutex> g{m};
          wrong |= !done.is_success() || first(done.result()) != float(n - 1) / 2;
          last = --left == 0 || wrong;
        }
        if (last) return cv.notify_all();
        pg.allreduce(t, {.op = reduce_op::AVG}).on_complete(next);
      };
      pg.barrier().wait();
      pg.allreduce(t, {.op = reduce_op::AVG}).on_complete(next);
      std::unique_lock<std::mutex> g{m};
      REQUIRE(cv.wait_for(g, 60s, [&] { return left == 0 || wrong; }));
      CHECK_FALSE(wrong);
    });
  }
}

TEST_CASE("a throwing callback on a real collective does not fail another call's wait") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    for (int i = 0; i < 20; ++i) {
      auto a = tensor::from_vector<float>({1.f});
      auto first_work = pg.allreduce(a);
      first_work.on_complete([](const work&) { throw std::runtime_error("user bug"); });
      auto b = tensor::from_vector<float>({2.f});
      auto second_work = pg.allreduce(b);
      // Either wait may be the one that completes the first work.
      CHECK_NOTHROW(second_work.wait());
      CHECK_NOTHROW(first_work.wait());
      CHECK(a.to_vector<float>()[0] == 2.f);
      CHECK(b.to_vector<float>()[0] == 4.f);
    }
  });
}

// -- awaiting from a CAF actor
// -------------------------------------------------------------------------

TEST_CASE("a CAF actor awaits a work without blocking") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto w = work::make("allreduce", "default");
  std::promise<float> got;
  auto fut = got.get_future();
  auto actor = sys.spawn([w, &got](caf::event_based_actor* self) -> caf::behavior {
    troupe::await(self, w, std::chrono::milliseconds(5000))
        .then([&got](const tensor_list& out) { got.set_value(first(out)); },
              [&got, self](caf::error& e) {
                got.set_exception(std::make_exception_ptr(
                    std::runtime_error("await failed: " + self->system().render(e))));
              });
    return {[](int x) { return x + 1; }};
  });
  // The actor answers other messages while its work is pending.
  caf::scoped_actor probe{sys};
  bool answered = false;
  probe->request(actor, std::chrono::seconds(5), 41)
      .receive(
          [&](int y) {
            answered = true;
            CHECK(y == 42);
          },
          [&](caf::error& e) { FAIL_CHECK("ping failed: " << sys.render(e)); });
  CHECK(answered);
  CHECK(fut.wait_for(0ms) == std::future_status::timeout);
  // Another thread completes the work later.
  std::thread completer{[w] {
    std::this_thread::sleep_for(20ms);
    w.complete(one(7));
  }};
  REQUIRE(fut.wait_for(5s) == std::future_status::ready);
  CHECK(fut.get() == 7.0f);
  completer.join();
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
}

TEST_CASE("a CAF actor receives a failed work as a caf::error carrying the message") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto w = work::make("barrier", "default");
  std::promise<std::string> got;
  auto fut = got.get_future();
  auto actor = sys.spawn([w, &got](caf::event_based_actor* self) {
    troupe::await(self, w, std::chrono::milliseconds(5000))
        .then([&got](const tensor_list&) { got.set_value("unexpected success"); },
              [&got, self](caf::error& e) {
                got.set_value(self->system().render(e));
                self->quit();
              });
  });
  w.fail(some_error("barrier on group 'default' (rank 0, seq 1) failed: Timeout", errc::timeout));
  REQUIRE(fut.wait_for(5s) == std::future_status::ready);
  auto msg = fut.get();
  CHECK_MESSAGE(msg.find("barrier on group 'default'") != std::string::npos, msg);
  CHECK_MESSAGE(msg.find("Timeout") != std::string::npos, msg);
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
}

TEST_CASE("a CAF actor awaits a real collective") {
  testing::run_ranks(2, [](world& w) {
    caf::actor_system_config cfg;
    caf::actor_system sys{cfg};
    auto t = tensor::from_vector<float>({static_cast<float>(w.rank() + 1)});
    auto wk = w.default_group().allreduce(t);
    std::promise<float> got;
    auto fut = got.get_future();
    auto actor = sys.spawn([wk, &got](caf::event_based_actor* self) {
      troupe::await(self, wk, std::chrono::milliseconds(10000))
          .then(
              [&got, self](const tensor_list& out) {
                got.set_value(first(out));
                self->quit();
              },
              [&got, self](caf::error& e) {
                got.set_exception(
                    std::make_exception_ptr(std::runtime_error(self->system().render(e))));
                self->quit();
              });
    });
    REQUIRE(fut.wait_for(10s) == std::future_status::ready);
    CHECK(fut.get() == 3.0f);
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  });
}

// c10d's registerOnCompletionHook and waitForPendingWorks on a process group.
TEST_CASE("an on-completion hook sees every call of its group finish, with its op, seq and times") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    // Shared with the hook, which outlives this function: across processes
    // run_ranks ends with a barrier on this group, and the hook sees it too.
    struct seen_calls {
      std::mutex mtx;
      std::vector<work_info> calls;
    };
    auto shared = std::make_shared<seen_calls>();
    auto& mtx = shared->mtx;
    auto& seen = shared->calls;
    pg.register_on_completion_hook([shared](const work_info& i) {
      std::lock_guard<std::mutex> g{shared->mtx};
      shared->calls.push_back(i);
    });
    // One hook per group, as c10d's.
    troupe::test::check_error([&] { pg.register_on_completion_hook([](const work_info&) {}); },
                              errc::invalid_argument, {"register_on_completion_hook", "already"});
    auto t = tensor::from_vector<float>({1.f, 2.f});
    pg.allreduce(t).wait();
    pg.broadcast(t, 0).wait();
    const int peer = 1 - w.rank();
    auto in = tensor::zeros({2}, dtype::float32);
    auto r = pg.recv(in, peer);
    pg.send(t, peer).wait();
    r.wait();
    // A failed call is reported too.
    auto lonely = tensor::zeros({1}, dtype::float32);
    auto f = pg.recv({lonely}, peer, {.tag = 5, .timeout = std::chrono::milliseconds(50)});
    CHECK_THROWS(f.wait());
    pg.barrier().wait();
    // Hooks run before waiters return or after: wait until all arrived.
    for (int i = 0; i < 2000; ++i) {
      {
        std::lock_guard<std::mutex> g{mtx};
        if (seen.size() >= 6) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::lock_guard<std::mutex> g{mtx};
    REQUIRE(seen.size() == 6);  // allreduce, broadcast, recv, send, the failed recv, barrier
    std::vector<std::string> ops;
    for (auto& i : seen) {
      ops.push_back(i.op);
      CHECK(i.time_finished >= i.time_started);
      CHECK(i.active_duration.count() >= 0);
    }
    for (const char* op : {"allreduce", "broadcast", "send", "recv", "barrier"})
      CHECK(std::count(ops.begin(), ops.end(), op) >= 1);
    const auto failed = std::count_if(seen.begin(), seen.end(), [](auto& i) { return !i.success; });
    CHECK(failed == 1);
    // Collectives carry their sequence numbers, in issue order.
    std::uint64_t last = 0;
    for (auto& i : seen)
      if (i.op == "allreduce" || i.op == "broadcast") {
        CHECK(i.seq > last);
        last = i.seq;
      }
  });
}

TEST_CASE("wait_for_pending_works returns once every issued call ended, rethrowing a failure") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    std::vector<work> works;
    std::vector<tensor> ts;
    for (int i = 0; i < 100; ++i) {
      ts.push_back(tensor::from_vector<float>({float(i)}));
      works.push_back(pg.allreduce(ts.back()));
    }
    pg.wait_for_pending_works();
    for (auto& wk : works) CHECK(wk.is_completed());
    CHECK(ts[99].to_vector<float>()[0] == 198.f);
    // A failed one among them: all end, then it is rethrown.
    auto lonely = tensor::zeros({1}, dtype::float32);
    auto f = pg.recv({lonely}, 1 - w.rank(), {.tag = 9, .timeout = std::chrono::milliseconds(50)});
    auto ok = pg.allreduce(ts[0]);
    troupe::test::check_error([&] { pg.wait_for_pending_works(); }, errc::timeout,
                              {"recv", "tag 9"});
    CHECK(ok.is_completed());
    pg.barrier().wait();
  });
}

// A large copy between ranks of one process is shared with the threads that
// wait for its send and its receive (kernels/shared_copy.hpp): a waiter,
// polling or asleep, takes chunks of a copy offered to its work. Here the
// offering thread copies nothing itself, so the waiter must copy it whole.
TEST_CASE("threads waiting for a work take part in the copy offered to them") {
  const std::size_t n = 8 * detail::shared_copy::chunk_bytes + 4093;  // a part chunk at the end
  std::vector<unsigned char> src(n), dst(n);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<unsigned char>(i * 7 + i / 251);
  // `batch`: the waiter waits for a when_all of the work (batch_isend_irecv).
  auto copied_by_waiter = [&](bool timed, std::chrono::milliseconds offer_after,
                              bool batch = false) {
    std::fill(dst.begin(), dst.end(), 0);
    auto w = work::make("recv", "g");
    auto waited = batch ? work::when_all("batch", "g", {work::completed("send", "g", {}), w}) : w;
    std::thread waiter([&] {
      if (timed)
        waited.wait(std::chrono::seconds(60));
      else
        waited.wait();
    });
    std::this_thread::sleep_for(offer_after);  // 0: polling; longer: asleep
    auto c = std::make_shared<detail::shared_copy>(dst.data(), src.data(), n);
    detail::offer_help(w, c);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (c->copied() < n && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const bool whole = c->copied() == n;
    detail::withdraw_help(w, c.get());
    w.complete({});
    waiter.join();
    return whole && dst == src;
  };
  CHECK(copied_by_waiter(false, std::chrono::milliseconds(0)));
  CHECK(copied_by_waiter(false, std::chrono::milliseconds(200)));
  CHECK(copied_by_waiter(true, std::chrono::milliseconds(200)));
  CHECK(copied_by_waiter(false, std::chrono::milliseconds(0), true));
  CHECK(copied_by_waiter(false, std::chrono::milliseconds(200), true));

  // Alone, or with threads claiming chunks at once: every byte once.
  std::fill(dst.begin(), dst.end(), 0);
  detail::shared_copy alone{dst.data(), src.data(), n};
  CHECK(alone.take_part() == n);
  alone.wait_whole();
  CHECK(dst == src);
  std::fill(dst.begin(), dst.end(), 0);
  detail::shared_copy together{dst.data(), src.data(), n};
  std::atomic<std::size_t> sum{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i) ts.emplace_back([&] { sum += together.take_part(); });
  for (auto& t : ts) t.join();
  together.wait_whole();
  CHECK(sum.load() == n);
  CHECK(dst == src);

  // A work that ended takes no offer.
  auto done = work::completed("recv", "g", {});
  detail::offer_help(done, std::make_shared<detail::shared_copy>(dst.data(), src.data(), n));
  CHECK(!done.state()->help);
}

TEST_CASE("an allreduce's and a reduce's result is their tensor, alone and inside end_coalescing") {
  // Their works keep the one output without a list (work_state::sole_output).
  for (int n : {1, 2, 3}) {
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      auto a = tensor::from_vector<float>(std::vector<float>(3, static_cast<float>(pg.rank() + 1)));
      auto r = pg.allreduce(a).result();
      REQUIRE(r.size() == 1);
      CHECK(r[0].is_same(a));
      CHECK(a.data_as<float>()[2] == static_cast<float>(n * (n + 1) / 2));

      auto b = tensor::from_vector<float>({1.0f, 1.0f});
      auto c = tensor::from_vector<float>(std::vector<float>(5, 2.0f));
      pg.start_coalescing();
      pg.allreduce(b);
      pg.reduce(c, 0);
      auto all = pg.end_coalescing();
      auto out = all.result();
      REQUIRE(out.size() == 2);
      CHECK(out[0].is_same(b));
      CHECK(out[1].is_same(c));
      CHECK(b.data_as<float>()[1] == static_cast<float>(n));
      if (pg.rank() == 0) CHECK(c.data_as<float>()[4] == static_cast<float>(2 * n));

      // A send's and a receive's result is their buffer too (small and large).
      if (n < 2) return;
      for (std::size_t len : {std::size_t{4}, std::size_t{1} << 19}) {
        auto buf = tensor::from_vector<float>(std::vector<float>(len, 7.0f));
        auto p2p = pg.rank() == 0   ? pg.send(buf, 1, 3)
                   : pg.rank() == 1 ? pg.recv(buf, 0, 3)
                                    : work{};
        if (!p2p.valid()) continue;
        auto got = p2p.result();
        REQUIRE(got.size() == 1);
        CHECK(got[0].is_same(buf));
        CHECK(buf.data_as<float>()[len - 1] == 7.0f);
      }
    });
  }
}

TEST_CASE("every collective's result is the caller's outputs, one tensor or a list") {
  // A call with one output keeps it without a list (collective_call::sole_output);
  // the others keep the list, and a barrier has none.
  auto same = [](const tensor_list& got, const tensor_list& want) {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i].is_same(want[i]));
  };
  for (int n : {1, 2, 3}) {
    testing::run_ranks(n, [n, &same](world& w) {
      auto& pg = w.default_group();
      const auto me = static_cast<float>(pg.rank());
      auto filled = [](std::int64_t len, float v) {
        return tensor::from_vector<float>(std::vector<float>(static_cast<std::size_t>(len), v));
      };
      for (std::int64_t len : {std::int64_t{1}, std::int64_t{300}}) {
        auto b = filled(len, me + 1);
        same(pg.broadcast(b, 0).result(), {b});
        CHECK(b.data_as<float>()[len - 1] == 1.0f);
        auto b1 = filled(len, me), b2 = filled(len, me);
        same(pg.broadcast(tensor_list{b1, b2}).result(), {b1, b2});
        CHECK(b2.data_as<float>()[0] == 0.0f);

        auto in = filled(len, me), all = filled(len * n, -1);
        same(pg.allgather_into_tensor(all, in).result(), {all});
        CHECK(all.data_as<float>()[len * n - 1] == static_cast<float>(n - 1));
        auto r = filled(len, -1);
        same(pg.reduce_scatter_tensor(r, filled(len * n, 1)).result(), {r});
        CHECK(r.data_as<float>()[len - 1] == static_cast<float>(n));
        auto a2a = filled(len * n, -1);
        same(pg.alltoall_single(a2a, filled(len * n, me)).result(), {a2a});
        CHECK(a2a.data_as<float>()[len * n - 1] == static_cast<float>(n - 1));

        auto s = filled(len, -1);
        tensor_list parts;
        if (pg.rank() == 0)
          for (int q = 0; q < n; ++q) parts.push_back(filled(len, static_cast<float>(q)));
        same(pg.scatter(s, parts).result(), {s});
        CHECK(s.data_as<float>()[len - 1] == me);
        tensor_list gathered;
        if (pg.rank() == 0)
          for (int q = 0; q < n; ++q) gathered.push_back(filled(len, -1));
        auto gw = pg.gather(gathered, filled(len, me));
        gw.wait();
        if (pg.rank() == 0) {
          same(gw.result(), gathered);
          CHECK(gathered[static_cast<std::size_t>(n - 1)].data_as<float>()[0] ==
                static_cast<float>(n - 1));
        }

        auto x = filled(len, 1), y = filled(len, 2);
        same(pg.allreduce(tensor_list{x, y}).result(), {x, y});
        CHECK(y.data_as<float>()[len - 1] == static_cast<float>(3 * n));
      }
      CHECK(pg.barrier().result().empty());
    });
  }
}

TEST_CASE("a futex_lock excludes: contending threads spin, sleep, wake and count exactly") {
  detail::futex_lock lock;
  long count = 0;
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 20000; ++i) {
        std::unique_lock<detail::futex_lock> g{lock, std::defer_lock};
        if (i % 2 == 0)
          g.lock();
        else
          while (!g.try_lock()) std::this_thread::yield();
        if (inside.fetch_add(1) != 0) ++overlaps;
        ++count;
        // Now and then a long hold: the others go past their spinning and sleep.
        if (t == 0 && i % 2000 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        inside.fetch_sub(1);
      }
    });
  for (auto& t : ts) t.join();
  CHECK(count == 4 * 20000);
  CHECK(overlaps.load() == 0);
  CHECK(lock.try_lock());
  lock.unlock();
}

TEST_CASE("blocks made on one thread and freed on another are never handed out twice") {
  using detail::recycled_allocate;
  using detail::recycled_free;
  // A reader thread makes the buffers of messages that came early and the
  // receiving thread frees them: the freeing thread's full shelves go to the
  // depot and the making thread's empty ones take them back. Every live block
  // holds its own pattern until it is freed; no two live blocks are one.
  struct block {
    unsigned char* p;
    std::size_t bytes;
    unsigned char mark;
  };
  std::mutex m;
  std::condition_variable cv;
  std::vector<block> handed;
  bool done = false;
  std::atomic<int> bad{0};
  std::thread consumer{[&] {
    for (;;) {
      std::vector<block> got;
      {
        std::unique_lock<std::mutex> g{m};
        cv.wait(g, [&] { return !handed.empty() || done; });
        if (handed.empty()) return;
        got.swap(handed);
      }
      for (auto& b : got) {
        for (std::size_t i = 0; i < b.bytes; ++i)
          if (b.p[i] != b.mark) ++bad;
        recycled_free(b.p, b.bytes);
      }
    }
  }};
  std::vector<void*> live;
  for (int round = 0; round < 300; ++round) {
    std::vector<block> batch;
    for (int i = 0; i < 40; ++i) {
      // Sizes across the classes, most in the smallest ones (as messages).
      const auto bytes = static_cast<std::size_t>(i % 4 == 3 ? 1 + (round * 37 + i * 53) % 2048
                                                             : 1 + (i * 7) % 200);
      auto* p = static_cast<unsigned char*>(recycled_allocate(bytes));
      const auto mark = static_cast<unsigned char>(round * 40 + i);
      std::memset(p, mark, bytes);
      batch.push_back({p, bytes, mark});
    }
    // Within a batch (all live at once) every block is a different one.
    live.clear();
    for (auto& b : batch) live.push_back(b.p);
    std::sort(live.begin(), live.end());
    CHECK(std::adjacent_find(live.begin(), live.end()) == live.end());
    {
      std::lock_guard<std::mutex> g{m};
      handed.insert(handed.end(), batch.begin(), batch.end());
    }
    cv.notify_one();
    // Blocks this thread frees itself between, as a rank's thread does.
    recycled_free(recycled_allocate(64), 64);
  }
  {
    std::lock_guard<std::mutex> g{m};
    done = true;
  }
  cv.notify_one();
  consumer.join();
  CHECK(bad.load() == 0);
}

TEST_CASE("a thread's freed blocks serve its next allocations of their size class") {
  using detail::recycled_allocate;
  using detail::recycled_free;
  // Empty this thread's shelf of the class of 65-128 bytes first.
  std::vector<void*> taken;
  for (int i = 0; i < 8; ++i) taken.push_back(recycled_allocate(100));
  for (auto* p : taken) recycled_free(p, 100);
  // The last blocks freed come back first, for any size of their class, and
  // each holds the class's whole size.
  auto* a = recycled_allocate(65);
  auto* b = recycled_allocate(128);
  CHECK(std::find(taken.begin(), taken.end(), a) != taken.end());
  CHECK(std::find(taken.begin(), taken.end(), b) != taken.end());
  CHECK(a != b);
  std::memset(a, 1, 128);
  std::memset(b, 2, 128);
  recycled_free(a, 65);
  recycled_free(b, 128);
  // Another class, a size past the shelves and a block of zero bytes.
  auto* big = recycled_allocate(5000);
  std::memset(big, 3, 5000);
  recycled_free(big, 5000);
  recycled_free(recycled_allocate(0), 0);
  recycled_free(nullptr, 64);
  // Blocks made on one thread and freed on others (that end with their
  // shelves full), many at once.
  std::vector<std::thread> ts;
  std::vector<std::vector<void*>> made(4);
  for (auto& m : made)
    for (int i = 0; i < 50; ++i)
      m.push_back(recycled_allocate(static_cast<std::size_t>(1 + i * 40)));
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&made, t] {
      for (std::size_t i = 0; i < made[static_cast<std::size_t>(t)].size(); ++i) {
        recycled_free(made[static_cast<std::size_t>(t)][i], 1 + i * 40);
        recycled_free(recycled_allocate(1 + i * 40), 1 + i * 40);
      }
    });
  for (auto& t : ts) t.join();

  // At thread exit, after the shelf was emptied, allocations come from
  // operator new: five blocks taken then are five different ones.
  static std::atomic<int> distinct{0};
  struct at_exit {
    ~at_exit() {
      std::vector<void*> got;
      for (int i = 0; i < 5; ++i) got.push_back(recycled_allocate(200));
      std::sort(got.begin(), got.end());
      distinct = static_cast<int>(std::unique(got.begin(), got.end()) - got.begin());
      for (auto* p : got) recycled_free(p, 200);
    }
  };
  std::thread late{[] {
    thread_local at_exit probe;  // made before the shelf's sweeper: ends after it
    (void)probe;
    std::vector<void*> some;
    for (int i = 0; i < 4; ++i) some.push_back(recycled_allocate(200));
    for (auto* p : some) recycled_free(p, 200);
  }};
  late.join();
  CHECK(distinct == 5);
}
