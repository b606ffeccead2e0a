// troupe::testing::simulate: the same seed gives the same schedule, results
// and errors; injected faults give the documented error on every other rank;
// virtual time ends a stalled wait at once; a sweep over seeds finds a
// planted ordering bug and names the seed that shows it.

#include <doctest/doctest.h>

#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "check_error.hpp"
#include "troupe/simulation.hpp"
#include "troupe/troupe.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::test::check_error;

namespace {

/// Ranks 1..n-1 each send their rank to rank 0, which takes them with
/// recv_any_source; then everyone allreduces. Returns rank 0's order.
std::vector<int> arrival_order(int n, std::uint64_t seed, std::string* schedule) {
  std::vector<int> order;
  testing::simulation_options o;
  o.seed = seed;
  o.schedule = schedule;
  testing::simulate(
      n,
      [&](world& w) {
        auto& g = w.default_group();
        auto t = tensor::from_vector<std::int32_t>({w.rank()});
        if (w.rank() == 0) {
          for (int i = 1; i < n; ++i) {
            auto wk = g.recv_any_source(t, {});
            wk.wait();
            order.push_back(wk.source_rank());
            CHECK(t.to_vector<std::int32_t>()[0] == wk.source_rank());
          }
        } else {
          g.send(t, 0, {}).wait();
        }
        auto s = tensor::from_vector<float>({1.0f});
        g.allreduce(s).wait();
        CHECK(s.to_vector<float>()[0] == float(n));
      },
      o);
  return order;
}

}  // namespace

TEST_CASE("the same seed gives the same schedule and results; seeds differ") {
  std::set<std::vector<int>> orders;
  for (std::uint64_t seed : {1, 2, 3, 4, 5, 6, 7, 8}) {
    CAPTURE(seed);
    std::string a, b;
    const auto first = arrival_order(4, seed, &a);
    const auto second = arrival_order(4, seed, &b);
    CHECK(first == second);
    CHECK(a == b);
    CHECK(!a.empty());
    orders.insert(first);
  }
  CHECK(orders.size() > 1);  // the seed decides who comes first
}

TEST_CASE("a killed rank: every other rank fails with peer_failure naming it, reproducibly") {
  // Twice as is, then with each rank pausing (in its turn) between issuing
  // and waiting: wall time passes that the turns do not, and must change
  // nothing (the schedule alone decides when the others notice the kill).
  for (int n : {2, 3, 4, 7}) {
    CAPTURE(n);
    std::string runs[3], failures[3];
    for (int run = 0; run < 3; ++run) {
      const bool pause = run == 2;
      std::mutex m;
      std::vector<std::string> errors(static_cast<std::size_t>(n));
      testing::simulation_options o;
      o.seed = 11;
      o.schedule = &runs[run];
      o.faults = {{testing::fault::kill, n - 1, 3}};
      testing::simulate(
          n,
          [&](world& w) {
            try {
              for (int i = 0; i < 5; ++i) {
                auto t = tensor::from_vector<float>({1.0f});
                auto wk = w.default_group().allreduce(t);
                if (pause && i == 2) std::this_thread::sleep_for(30ms);
                wk.wait();
              }
            } catch (const error& e) {
              CHECK(e.code() == errc::peer_failure);
              std::lock_guard<std::mutex> g{m};
              errors[static_cast<std::size_t>(w.rank())] = e.what();
            }
          },
          o);
      for (int r = 0; r < n - 1; ++r) {
        CAPTURE(r);
        const auto& e = errors[static_cast<std::size_t>(r)];
        CHECK(e.find("allreduce") != std::string::npos);
        CHECK(e.find("rank " + std::to_string(n - 1) + " was killed") != std::string::npos);
        CHECK(e.find("seed 11") != std::string::npos);
        failures[run] += e + "\n";
      }
      CHECK(runs[run].find("killed at call 3") != std::string::npos);
    }
    CHECK(runs[0] == runs[1]);
    CHECK(runs[0] == runs[2]);
    CHECK(failures[0] == failures[1]);
    CHECK(failures[0] == failures[2]);
  }
}

TEST_CASE("a killed sender: its receiver fails naming it, the same way however long turns take") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    std::string runs[3], failures[3];
    for (int run = 0; run < 3; ++run) {
      const bool pause = run == 2;
      std::mutex m;
      testing::simulation_options o;
      o.seed = 7;
      o.schedule = &runs[run];
      o.faults = {{testing::fault::kill, n - 1, 2}};
      testing::simulate(
          n,
          [&](world& w) {
            auto& g = w.default_group();
            auto t = tensor::from_vector<float>({float(w.rank())});
            try {
              for (int i = 0; i < 3; ++i) {
                if (w.rank() == 0) {
                  for (int src = 1; src < n; ++src) {
                    auto wk = g.recv(t, src, {});
                    if (pause) std::this_thread::sleep_for(30ms);
                    wk.wait();
                    CHECK(t.to_vector<float>()[0] == float(src));
                  }
                } else {
                  auto wk = g.send(t, 0, {});
                  if (pause) std::this_thread::sleep_for(30ms);
                  wk.wait();
                }
              }
            } catch (const error& e) {
              CHECK(e.code() == errc::peer_failure);
              std::lock_guard<std::mutex> lk{m};
              failures[run] += "rank " + std::to_string(w.rank()) + ": " + e.what() + "\n";
            }
          },
          o);
      CHECK(failures[run].find("rank 0: ") != std::string::npos);
      CHECK(failures[run].find("rank " + std::to_string(n - 1)) != std::string::npos);
    }
    CHECK(runs[0] == runs[1]);
    CHECK(runs[0] == runs[2]);
    CHECK(failures[0] == failures[1]);
    CHECK(failures[0] == failures[2]);
  }
}

TEST_CASE("a frozen rank: the others time out in virtual time, naming it") {
  std::mutex m;
  std::vector<std::string> errors(3);
  testing::simulation_options o;
  o.seed = 5;
  o.timeout = 30min;  // virtual time: the run takes milliseconds anyway
  o.faults = {{testing::fault::freeze, 1, 2}};
  const auto t0 = std::chrono::steady_clock::now();
  testing::simulate(
      3,
      [&](world& w) {
        try {
          for (int i = 0; i < 3; ++i) w.default_group().barrier().wait();
        } catch (const error& e) {
          CHECK(e.code() == errc::timeout);
          std::lock_guard<std::mutex> g{m};
          errors[static_cast<std::size_t>(w.rank())] = e.what();
        }
      },
      o);
  CHECK(std::chrono::steady_clock::now() - t0 < 20s);
  for (int r : {0, 2}) {
    CAPTURE(r);
    CHECK(errors[static_cast<std::size_t>(r)].find("barrier") != std::string::npos);
    CHECK(errors[static_cast<std::size_t>(r)].find("rank 1, which is frozen") != std::string::npos);
  }
}

TEST_CASE("a deadlock fails at once in virtual time, and the error carries the seed") {
  testing::simulation_options o;
  o.seed = 99;
  o.timeout = 30min;
  const auto t0 = std::chrono::steady_clock::now();
  // Both ranks receive first: neither ever sends.
  check_error(
      [&] {
        testing::simulate(
            2,
            [](world& w) {
              auto t = tensor::from_vector<float>({0.0f});
              w.default_group().recv(t, 1 - w.rank(), {}).wait();
            },
            o);
      },
      errc::timeout, {"seed 99: rank", "recv", "virtual time", "deadlock"});
  CHECK(std::chrono::steady_clock::now() - t0 < 20s);
}

TEST_CASE("a sweep over 1000 seeds finds a planted ordering bug, and its seed reproduces it") {
  // The bug: rank 0 assumes rank 1's message comes before rank 2's.
  auto buggy = [](world& w) {
    auto& g = w.default_group();
    auto t = tensor::from_vector<std::int32_t>({w.rank()});
    if (w.rank() == 0) {
      g.recv_any_source(t, {}).wait();
      if (t.to_vector<std::int32_t>()[0] != 1)
        throw error(errc::internal, "expected rank 1's message first");
      g.recv_any_source(t, {}).wait();
    } else {
      g.send(t, 0, {}).wait();
    }
  };
  const auto seed = testing::find_failing_seed(3, buggy, 0, 1000);
  REQUIRE(seed.has_value());
  testing::simulation_options o;
  o.seed = *seed;
  for (int i = 0; i < 2; ++i)
    check_error([&] { testing::simulate(3, buggy, o); }, errc::internal,
                {"seed " + std::to_string(*seed), "expected rank 1's message first"});
  // The fixed program passes every seed of the sweep's first 50.
  auto fixed = [](world& w) {
    auto& g = w.default_group();
    auto t = tensor::from_vector<std::int32_t>({w.rank()});
    if (w.rank() == 0) {
      int sum = 0;
      for (int i = 0; i < 2; ++i) {
        g.recv_any_source(t, {}).wait();
        sum += t.to_vector<std::int32_t>()[0];
      }
      if (sum != 3) throw error(errc::internal, "lost a message");
    } else {
      g.send(t, 0, {}).wait();
    }
  };
  CHECK_FALSE(testing::find_failing_seed(3, fixed, 0, 50).has_value());
}

TEST_CASE("simulate refuses bad faults") {
  testing::simulation_options o;
  o.faults = {{testing::fault::kill, 5, 1}};
  check_error(
      [&] {
        testing::simulate(
            2, [](world&) {}, o);
      },
      errc::invalid_argument, {"simulate", "rank 5"});
  o.faults = {{testing::fault::kill, 0, 0}};
  check_error(
      [&] {
        testing::simulate(
            2, [](world&) {}, o);
      },
      errc::invalid_argument, {"simulate", "call 0"});
}
