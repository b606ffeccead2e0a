// enable_collectives_timing (c10d's enableCollectivesTiming) switches timing
// on: in this executable the flight recorder is off (TROUPE_FLIGHT_RECORDER=0,
// set before any group exists), so a group keeps no record of its calls,
// with their issue and end times, unless timing was enabled on it.

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

// The recorder's capacity is read once per process, when the first group is
// made: set it off before main.
const bool recorder_off = [] {
  ::setenv("TROUPE_FLIGHT_RECORDER", "0", 1);
  return true;
}();

constexpr std::int64_t slack_us = 1'000'000;

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

TEST_CASE("without enable_collectives_timing a group records nothing here") {
  REQUIRE(recorder_off);
  REQUIRE(std::string(std::getenv("TROUPE_FLIGHT_RECORDER")) == "0");
  testing::run_ranks(2, [](world& w) {
    auto t = tensor::from_vector<float>({1.0f});
    w.default_group().allreduce(t).wait();
    w.default_group().barrier().wait();
    CHECK(w.default_group().flight_record().empty());
    CHECK(w.flight_record().empty());
  });
}

TEST_CASE("enable_collectives_timing records each call with its issue and end times") {
  for (int n : {1, 2, 3, 4, 7}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& timed = w.default_group();
      auto untimed = w.new_group({0});  // not enabled: stays silent
      auto t = tensor::from_vector<float>({1.0f});
      timed.allreduce(t).wait();  // before timing: not recorded
      const auto before = now_us();
      timed.enable_collectives_timing();
      timed.enable_collectives_timing();  // idempotent
      timed.allreduce(t).wait();
      timed.broadcast(t, n - 1).wait();
      auto slow = timed.barrier();
      slow.wait();
      if (untimed->is_member()) untimed->barrier().wait();
      const auto after = now_us();
      const auto rec = timed.flight_record();
      REQUIRE(rec.size() == 3);
      const char* ops[] = {"allreduce", "broadcast", "barrier"};
      for (std::size_t i = 0; i < rec.size(); ++i) {
        CAPTURE(i);
        CHECK(rec[i].op == ops[i]);
        CHECK(rec[i].seq == i + 2);  // the first allreduce was number 1
        CHECK(rec[i].state == "completed");
        // Within the calls' span (a second's slack: the record's clock
        // readings are the engine's, converted to the system clock).
        CHECK(rec[i].issued_us >= before - slack_us);
        CHECK(rec[i].ended_us >= rec[i].issued_us);  // a duration: filled only when timed
        CHECK(rec[i].ended_us <= after + slack_us);
        CHECK(rec[i].rank == w.rank());
        CHECK(rec[i].group_size == n);
      }
      CHECK(rec[0].numel == 1);
      CHECK(rec[0].dtype == "float32");
      if (untimed->is_member()) CHECK(untimed->flight_record().empty());
      // world::flight_record gathers the timed group's entries only.
      CHECK(w.flight_record().size() == 3);
    });
  }
}
