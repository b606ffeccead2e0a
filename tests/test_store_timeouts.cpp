// The store's timeout end to end: a get or wait on a key nobody sets fails
// at the timeout (not before, not never) with errc::timeout and a text that
// names the call, the key and the time. Through the world's own store: a
// hash_store in one process, the job's tcp_store across processes when the
// suite runs under troupe-run (then every rank but rank 0's process asks the
// server over TCP).

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "troupe/error.hpp"
#include "troupe/store.hpp"
#include "troupe/tcp_store.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

/// The troupe::error `f` throws (a failed check if none).
template <class F>
error error_of(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e;
  }
  FAIL_CHECK("expected a troupe::error");
  return error(errc::internal, "nothing thrown");
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

using clock_type = std::chrono::steady_clock;

}  // namespace

TEST_CASE("the default store timeout is c10d's 300 s") {
  CHECK(store::default_timeout == 300s);
  CHECK(hash_store{}.timeout() == 300s);
  CHECK(tcp_store_options{}.timeout == 300s);
}

TEST_CASE("a get or wait on a missing key fails at the store's timeout, naming the key") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      // A namespace of this rank's own, with its own timeout (the world's
      // store keeps its).
      prefix_store mine{"timeouts/" + std::to_string(w.rank()), w.get_store()};
      mine.set_timeout(300ms);
      auto start = clock_type::now();
      auto e = error_of([&] { (void)mine.get("never_set"); });
      auto took = clock_type::now() - start;
      CHECK(e.code() == errc::timeout);
      INFO(e.what());
      CHECK(has(e.what(), "never_set"));
      CHECK(has(e.what(), "300 ms"));
      CHECK(has(e.what(), "get"));
      CHECK(took >= 300ms);
      CHECK(took < 30s);  // at the timeout, not a hang
      start = clock_type::now();
      e = error_of([&] { mine.wait({"first", "second"}, 200ms); });
      took = clock_type::now() - start;
      CHECK(e.code() == errc::timeout);
      CHECK(has(e.what(), "first"));
      CHECK(has(e.what(), "second"));
      CHECK(has(e.what(), "200 ms"));
      CHECK(took >= 200ms);
      CHECK(took < 30s);
      // A key that comes in time is no failure: rank 0 sets one late for
      // every other rank (across processes: through the server).
      auto& shared = *w.get_store();
      const auto ready = "timeouts/ready/" + std::to_string(n);
      if (w.rank() == 0) {
        std::this_thread::sleep_for(100ms);
        shared.set(ready, to_bytes("yes"));
      } else {
        shared.wait({ready}, 20s);
        CHECK(to_string(shared.get(ready)) == "yes");
      }
    });
  }
}
