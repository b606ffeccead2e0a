// troupe::testing::simulate: the same seed gives the same schedule, results
// and errors; injected faults give the documented error on every other rank;
// virtual time ends a stalled wait at once; a sweep over seeds finds a
// planted ordering bug and names the seed that shows it.

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "approx.hpp"
#include "check_error.hpp"
#include "scoped_env.hpp"
#include "troupe/simulation.hpp"
#include "troupe/troupe.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::test::check_error;

// simulate needs the inline engine: under TROUPE_ENGINE=actors or
// TROUPE_FABRIC=off the cases run on it all the same.
const troupe::test::inline_engine_env on_the_inline_engine;

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

TEST_CASE("simulate refuses the actor engine, naming the variable that chose it") {
  auto program = [](world& w) { w.default_group().barrier().wait(); };
  {
    troupe::test::scoped_env engine{"TROUPE_ENGINE", nullptr};
    troupe::test::scoped_env fabric{"TROUPE_FABRIC", "off"};
    check_error([&] { testing::simulate(2, program); }, errc::invalid_argument,
                {"simulate: TROUPE_FABRIC=off runs collectives on the group actors",
                 "TROUPE_ENGINE=inline"});
  }
  troupe::test::scoped_env engine{"TROUPE_ENGINE", "actors"};
  check_error([&] { testing::simulate(2, program); }, errc::invalid_argument,
              {"simulate: TROUPE_ENGINE=actors"});
}

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

TEST_CASE("a call that moves in several passes is progress, not a deadlock") {
  // A root's 1 MiB broadcast is issued after its call handed the turn on,
  // and the others copy it in passes: neither may read as a stalled round
  // (seed 0 at 2 and 4 ranks failed as a deadlock before).
  for (int n : {2, 3, 4}) {
    for (std::uint64_t seed = 0; seed < 6; ++seed) {
      CAPTURE(n);
      CAPTURE(seed);
      testing::simulation_options o;
      o.seed = seed;
      CHECK_NOTHROW(testing::simulate(
          n,
          [](world& w) {
            auto& g = w.default_group();
            auto b = tensor::zeros({1 << 18}, dtype::float32);
            if (g.rank() == 0) b = tensor::from_vector(std::vector<float>(1 << 18, 2.0f));
            g.broadcast(b, {}).wait();
            CHECK(b.to_vector<float>()[(1 << 18) - 1] == 2.0f);
            const std::int64_t each = 16384 * g.size();
            auto out = tensor::zeros({each}, dtype::float32);
            g.alltoall_single(out, b.flat_slice(0, each), {}, {}, {}).wait();
          },
          o));
    }
  }
}

// -- virtual time (simulation_options::timing) ----------------------------------

namespace {

constexpr const char* costs = "host=50us:1GB/s,local=5us:5GB/s";

testing::simulation_options timed(int hosts, int per_host, std::vector<testing::timed_call>* calls,
                                  std::vector<double>* ends = nullptr) {
  testing::simulation_options o;
  o.timing = testing::virtual_timing{{hosts, per_host}, costs, calls, ends};
  return o;
}

}  // namespace

TEST_CASE("timed: an allreduce across hosts takes the cost model's time on every rank") {
  std::vector<testing::timed_call> calls;
  std::vector<double> ends;
  constexpr std::uint64_t bytes = 1 << 20;
  const auto want = testing::predict("allreduce", bytes, {2, 4}, costs);
  REQUIRE(want.seconds > 0);
  std::mutex mtx;
  std::vector<double> seen;
  testing::simulate(
      8,
      [&](world& w) {
        auto t = tensor::zeros({bytes / 4}, dtype::float32);
        CHECK(testing::virtual_now() == 0);
        w.default_group().allreduce(t).wait();
        std::lock_guard<std::mutex> g{mtx};
        seen.push_back(testing::virtual_now());
      },
      timed(2, 4, &calls, &ends));
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].op == "allreduce");
  CHECK(calls[0].bytes == bytes);
  CHECK(calls[0].ranks == 8);
  CHECK(calls[0].arrived == 8);
  CHECK(calls[0].algorithm == want.algorithm);
  CHECK(calls[0].start == 0);
  CHECK(calls[0].seconds == test::relative(want.seconds));
  REQUIRE(seen.size() == 8);
  for (double s : seen) CHECK(s == test::relative(want.seconds));
  REQUIRE(ends.size() == 8);
  for (double e : ends) CHECK(e == test::relative(want.seconds));
}

TEST_CASE("timed: the last rank's arrival starts a call; computing overlaps a pending one") {
  std::vector<testing::timed_call> calls;
  std::vector<double> ends;
  const double ar = testing::predict("allreduce", 4, {4, 1}, costs).seconds;
  const double bc = testing::predict("broadcast", 1 << 20, {4, 1}, costs).seconds;
  REQUIRE(bc < 1.0);
  testing::simulate(
      4,
      [&](world& w) {
        auto& g = w.default_group();
        if (w.rank() == 2) testing::virtual_compute(0.01);  // the others wait for it
        auto s = tensor::zeros({1}, dtype::float32);
        g.allreduce(s).wait();
        CHECK(testing::virtual_now() == test::relative(0.01 + ar));
        auto b = tensor::zeros({(1 << 20) / 4}, dtype::float32);
        auto pending = g.broadcast(b, {});
        testing::virtual_compute(1.0);  // longer than the broadcast: it ended meanwhile
        pending.wait();
        CHECK(testing::virtual_now() == test::relative(0.01 + ar + 1.0));
        auto c = g.broadcast(b, {});
        c.wait();  // nothing to overlap: its whole time
        CHECK(testing::virtual_now() == test::relative(0.01 + ar + 1.0 + bc));
      },
      timed(4, 1, &calls, &ends));
  REQUIRE(calls.size() == 3);
  CHECK(calls[0].start == test::relative(0.01));
  CHECK(calls[1].op == "broadcast");
  CHECK(calls[1].start == test::relative(0.01 + ar));
  CHECK(calls[1].seconds == test::relative(bc));
  CHECK(calls[2].start == test::relative(0.01 + ar + 1.0));
  for (double e : ends) CHECK(e == test::relative(0.01 + ar + 1.0 + bc));
}

TEST_CASE("timed: waiting for a coalesced batch or a when_all waits for each of its calls") {
  const double small = testing::predict("allreduce", 4, {2, 2}, costs).seconds;
  const double big = testing::predict("allreduce", 1 << 20, {2, 2}, costs).seconds;
  REQUIRE(big > small);
  testing::simulate(
      4,
      [&](world& w) {
        auto& g = w.default_group();
        auto a = tensor::zeros({1}, dtype::float32);
        auto b = tensor::zeros({(1 << 20) / 4}, dtype::float32);
        g.start_coalescing();
        g.allreduce(a);
        g.allreduce(b);
        g.end_coalescing().wait();  // both started at 0: the larger ends last
        CHECK(testing::virtual_now() == test::relative(big));
        auto x = g.allreduce(a);
        auto y = g.allreduce(a);
        work::when_all("both", "default", {x, y}).wait();
        CHECK(testing::virtual_now() == test::relative(big + small));
        x.wait();  // waited for already: no time again
        CHECK(testing::virtual_now() == test::relative(big + small));
      },
      timed(2, 2, nullptr));
}

TEST_CASE("timed: a send arrives a link's latency + bytes / bandwidth after it left") {
  // 2 hosts x 2 ranks: rank 0 -> 2 crosses hosts (50 us, 1 GB/s), 0 -> 1 not (5 us, 5 GB/s).
  std::vector<double> ends;
  testing::simulate(
      4,
      [&](world& w) {
        auto& g = w.default_group();
        auto t = tensor::zeros({250000}, dtype::float32);  // 1 MB
        if (w.rank() == 0) {
          testing::virtual_compute(1e-3);
          g.send(t, 2, {}).wait();
          CHECK(testing::virtual_now() == test::relative(1e-3 + 50e-6 + 1e-3));
          g.send(t, 1, {}).wait();
          CHECK(testing::virtual_now() == test::relative(2.05e-3 + 5e-6 + 2e-4));
        } else if (w.rank() == 2) {
          g.recv(t, 0, {}).wait();
          CHECK(testing::virtual_now() == test::relative(2.05e-3));
        } else if (w.rank() == 1) {
          auto r = g.recv_any_source(t, {});
          r.wait();
          CHECK(r.source_rank() == 0);
          CHECK(testing::virtual_now() == test::relative(2.05e-3 + 5e-6 + 2e-4));
        }
        // A ring exchange in one batch: each rank's clock moves to the later
        // of its send's arrival and its receive's.
        const double before = testing::virtual_now();
        const int n = g.size(), r = g.rank();
        auto out = tensor::zeros({1000}, dtype::float32),
             in = tensor::zeros({1000}, dtype::float32);
        std::vector<p2p_op> ops{{p2p_op::isend, out, (r + 1) % n},
                                {p2p_op::irecv, in, (r + n - 1) % n}};
        g.batch_isend_irecv(ops).wait();
        CHECK(testing::virtual_now() > before);
      },
      timed(2, 2, nullptr, &ends));
  // The batch: rank 3 (idle so far) sends to rank 0 across hosts, arriving
  // at 54 us, and receives from rank 2 (its host), which sent at 2.05 ms.
  CHECK(ends[3] == test::relative(2.05e-3 + 5e-6 + 4000 / 5e9));
}

TEST_CASE(
    "timed: reduce, reduce_scatter, allgather, gather, scatter, alltoall and barrier are priced") {
  std::vector<testing::timed_call> calls;
  testing::simulate(
      4,
      [&](world& w) {
        auto& g = w.default_group();
        const int n = g.size();
        auto block = tensor::zeros({1000}, dtype::float32);  // 4,000 bytes
        auto all = tensor::zeros({1000 * n}, dtype::float32);
        g.reduce(all, {}).wait();
        g.reduce_scatter_tensor(block, all, {}).wait();
        g.allgather_into_tensor(all, block, {}).wait();
        tensor_list parts;
        if (g.rank() == 0)
          for (int i = 0; i < n; ++i) parts.push_back(tensor::zeros({1000}, dtype::float32));
        g.gather(parts, block, {}).wait();
        g.scatter(block, parts, {}).wait();
        auto a2a = tensor::zeros({1000 * n}, dtype::float32);
        g.alltoall_single(a2a, all, {}, {}, {}).wait();
        g.barrier().wait();
      },
      timed(2, 2, &calls));
  const std::vector<std::pair<std::string, std::string>> want{{"reduce", ""},
                                                              {"reduce_scatter_tensor", ""},
                                                              {"allgather_into_tensor", ""},
                                                              {"gather", "gather_direct"},
                                                              {"scatter", "scatter_direct"},
                                                              {"alltoall_single", ""},
                                                              {"barrier", "barrier_dissemination"}};
  REQUIRE(calls.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(calls[i].op);
    CHECK(calls[i].op == want[i].first);
    if (!want[i].second.empty()) CHECK(calls[i].algorithm == want[i].second);
    CHECK(calls[i].seconds > 0);
    CHECK(calls[i].bytes == (calls[i].op == "barrier" ? 0u : 16000u));
    if (i > 0) CHECK(calls[i].start == test::relative(calls[i - 1].start + calls[i - 1].seconds));
  }
  CHECK(calls[0].algorithm == testing::predict("reduce", 16000, {2, 2}, costs).algorithm);
  CHECK(calls[2].algorithm == testing::predict("allgather", 16000, {2, 2}, costs).algorithm);
  // 16 KB over 2 x 2: the hierarchy's exchange within each host, then one
  // between them, beats recursive halving's 2 steps and the ring's 3; an
  // alltoall of 4 KB blocks among 4 ranks is one exchange with each.
  CHECK(calls[1].algorithm == "reduce_scatter_hier (striped)");
  CHECK(calls[1].algorithm == testing::predict("reduce_scatter", 16000, {2, 2}, costs).algorithm);
  CHECK(calls[5].algorithm == "alltoall_pairwise");
  CHECK(calls[5].algorithm == testing::predict("alltoall", 16000, {2, 2}, costs).algorithm);
}

TEST_CASE("timed: an alltoall without split sizes may run Bruck's steps, the list form never") {
  std::vector<testing::timed_call> calls;
  testing::simulate(
      64,
      [&](world& w) {
        auto& g = w.default_group();
        auto in = tensor::zeros({64}, dtype::float32), out = tensor::zeros({64}, dtype::float32);
        g.alltoall_single(out, in, {}, {}, {}).wait();
        tensor_list ins, outs;
        for (int i = 0; i < 64; ++i) {
          ins.push_back(tensor::zeros({1}, dtype::float32));
          outs.push_back(tensor::zeros({1}, dtype::float32));
        }
        g.alltoall(outs, ins, {}).wait();
      },
      timed(8, 8, &calls));
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].algorithm == "alltoall_bruck");
  CHECK(calls[0].algorithm == testing::predict("alltoall", 256, {8, 8}, costs).algorithm);
  CHECK(calls[1].algorithm == "alltoall_pairwise");
  CHECK(calls[1].seconds > calls[0].seconds);
}

TEST_CASE(
    "timed: 256 ranks on 32 hosts, each call as predict() prices it, the same run after run") {
  std::vector<testing::timed_call> first, second;
  auto program = [](world& w) {
    auto& g = w.default_group();
    auto s = tensor::zeros({1}, dtype::float32);
    g.allreduce(s).wait();
    auto b = tensor::zeros({16384}, dtype::float32);
    g.broadcast(b, {}).wait();
  };
  testing::simulate(256, program, timed(32, 8, &first));
  testing::simulate(256, program, timed(32, 8, &second));
  REQUIRE(first.size() == 2);
  const auto ar = testing::predict("allreduce", 4, {32, 8}, costs);
  const auto bc = testing::predict("broadcast", 65536, {32, 8}, costs);
  CHECK(first[0].algorithm == ar.algorithm);
  CHECK(first[0].seconds == test::relative(ar.seconds));
  CHECK(first[1].algorithm == bc.algorithm);
  CHECK(first[1].start == test::relative(ar.seconds));
  CHECK(first[1].seconds == test::relative(bc.seconds));
  REQUIRE(second.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(second[i].algorithm == first[i].algorithm);
    CHECK(second[i].start == first[i].start);
    CHECK(second[i].seconds == first[i].seconds);
  }
}

TEST_CASE("timed: a killed rank's call is reported with the ranks that came") {
  std::vector<testing::timed_call> calls;
  std::vector<double> ends;
  auto o = timed(2, 2, &calls, &ends);
  o.faults = {{testing::fault::kill, 3, 2}};  // rank 3 dies at its second call
  CHECK_THROWS_AS(testing::simulate(
                      4,
                      [](world& w) {
                        auto& g = w.default_group();
                        auto s = tensor::zeros({1}, dtype::float32);
                        g.allreduce(s).wait();
                        g.allreduce(s).wait();
                      },
                      o),
                  error);
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].arrived == 4);
  CHECK(calls[1].arrived == 3);
  CHECK(calls[1].start == test::relative(calls[0].seconds));
  REQUIRE(ends.size() == 4);
  for (double e : ends) CHECK(e == test::relative(calls[0].seconds));  // the second failed
}

TEST_CASE("timed: ranks that share their hosts' CPUs take the longer time predict gives them") {
  // 2 hosts x 4 ranks on 1 CPU each: 4 ranks per CPU.
  constexpr std::uint64_t bytes = 4;
  const auto own = testing::predict("allreduce", bytes, {2, 4}, costs);
  const auto shared = testing::predict("allreduce", bytes, {2, 4, 1.0}, costs);
  CHECK(shared.seconds > 4 * own.seconds);
  std::vector<testing::timed_call> calls;
  auto o = timed(2, 4, &calls);
  o.timing->layout.cpus_per_host = 1;
  testing::simulate(
      8,
      [&](world& w) {
        auto t = tensor::zeros({1}, dtype::float32);
        w.default_group().allreduce(t).wait();
      },
      o);
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].algorithm == shared.algorithm);
  CHECK(calls[0].seconds == test::relative(shared.seconds));
  // As many CPUs as ranks, or more: nothing shared.
  CHECK(testing::predict("allreduce", bytes, {2, 4, 4.0}, costs).seconds ==
        test::relative(own.seconds));
  CHECK(testing::predict("allreduce", bytes, {2, 4, 16.0}, costs).seconds ==
        test::relative(own.seconds));
}

TEST_CASE("timed: bad layouts, costs and durations are refused, naming them") {
  for (double cpus : {-1.0, std::nan("")}) {
    auto bad = timed(2, 2, nullptr);
    bad.timing->layout.cpus_per_host = cpus;
    check_error(
        [&] {
          testing::simulate(
              4, [](world&) {}, bad);
        },
        errc::invalid_argument, {"simulate", "cpus_per_host"});
    check_error(
        [&] {
          testing::predict("allreduce", 4, {2, 2, cpus});
        },
        errc::invalid_argument, {"predict", "cpus_per_host"});
  }
  check_error(
      [&] {
        testing::simulate(
            4, [](world&) {}, timed(3, 2, nullptr));
      },
      errc::invalid_argument, {"simulate", "3 hosts x 2 ranks", "4 ranks"});
  auto o = timed(2, 2, nullptr);
  o.timing->link_costs = "host=fast";
  check_error(
      [&] {
        testing::simulate(
            4, [](world&) {}, o);
      },
      errc::invalid_argument, {"TROUPE_LINK_COSTS", "host=fast"});
  check_error([] { testing::virtual_now(); }, errc::invalid_argument,
              {"virtual_now", "timed simulation"});
  check_error([] { testing::virtual_compute(1); }, errc::invalid_argument,
              {"virtual_compute", "timed simulation"});
  check_error(
      [] {
        testing::simulate(
            2, [](world&) { testing::virtual_compute(-1); }, timed(1, 2, nullptr));
      },
      errc::invalid_argument, {"virtual_compute", "seconds -1"});
  // Untimed simulations have no clock.
  check_error([] { testing::simulate(2, [](world&) { testing::virtual_now(); }); },
              errc::invalid_argument, {"virtual_now"});
}
