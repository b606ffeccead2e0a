// predict_bench — what troupe would run, and how long it would take, for
// jobs far larger than this machine: testing::predict (the cost model the
// ranks consult when they choose an algorithm) over layouts of hosts, for
// allreduce and broadcast of 4 B, 1 MiB and 64 MiB. Prints one table, and
// the wall time every prediction took together.
//
//   predict_bench [--link-costs COSTS] [--simulate] [HOSTSxRANKS ...]
//
// COSTS: TROUPE_LINK_COSTS's syntax (default: the process's model). Default
// layouts: 128x8, 512x8, 2048x8 (1,024, 4,096 and 16,384 ranks) and 4096x1.
// --simulate runs a program instead, on real in-process ranks under
// testing::simulate's virtual time (default layouts 16x8 and 128x8): an
// allreduce of 4 B, one of 64 KiB and a broadcast of 64 KiB on every rank,
// each call's virtual start and time beside predict()'s, and the run's
// wall time.
#include <troupe/simulation.hpp>

#include <troupe/troupe.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace {

/// --simulate: the program on hosts x ranks, timed; 1 when a call's time is
/// not predict()'s.
int simulate_layouts(const std::vector<troupe::testing::host_layout>& layouts,
                     const std::string& costs) {
  namespace tt = troupe::testing;
  std::printf(
      "| ranks | hosts x ranks | call | size | algorithm | start (ms) | time (ms) | "
      "predict (ms) | run's wall time (s) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  int bad = 0;
  for (const auto& l : layouts) {
    std::vector<tt::timed_call> calls;
    tt::simulation_options o;
    o.timing = tt::virtual_timing{l, costs, &calls, nullptr};
    const auto t0 = std::chrono::steady_clock::now();
    tt::simulate(
        l.hosts * l.ranks_per_host,
        [](troupe::world& w) {
          auto& g = w.default_group();
          auto one = troupe::tensor::zeros({1}, troupe::dtype::float32);
          g.allreduce(one).wait();
          auto b = troupe::tensor::zeros({16384}, troupe::dtype::float32);
          g.allreduce(b).wait();
          g.broadcast(b, {}).wait();
        },
        o);
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const auto& c : calls) {
      const auto p = tt::predict(c.op, c.bytes, l, costs);
      if (std::abs(p.seconds - c.seconds) > 1e-9 * std::max(1.0, p.seconds)) ++bad;
      std::printf("| %d | %d x %d | %s | %llu B | %s | %.3f | %.3f | %.3f | %.2f |\n",
                  l.hosts * l.ranks_per_host, l.hosts, l.ranks_per_host, c.op.c_str(),
                  static_cast<unsigned long long>(c.bytes), c.algorithm.c_str(), c.start * 1e3,
                  c.seconds * 1e3, p.seconds * 1e3, wall);
    }
  }
  if (bad) std::fprintf(stderr, "predict_bench: %d call(s) timed unlike predict()\n", bad);
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string costs;
  std::vector<troupe::testing::host_layout> layouts;
  bool simulated = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--link-costs" && i + 1 < argc) {
        costs = argv[++i];
        continue;
      }
      if (a == "--simulate") {
        simulated = true;
        continue;
      }
      const auto x = a.find('x');
      if (x == std::string::npos) throw std::invalid_argument("'" + a + "' is not HOSTSxRANKS");
      layouts.push_back({std::stoi(a.substr(0, x)), std::stoi(a.substr(x + 1))});
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "predict_bench: %s\nusage: predict_bench [--link-costs C] [--simulate] [HxR "
                 "...]\n",
                 e.what());
    return 2;
  }
  if (simulated) {
    if (layouts.empty()) layouts = {{16, 8}, {128, 8}};
    try {
      return simulate_layouts(layouts, costs);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "predict_bench: %s\n", e.what());
      return 1;
    }
  }
  if (layouts.empty()) layouts = {{128, 8}, {512, 8}, {2048, 8}, {4096, 1}};
  struct size {
    const char* label;
    std::uint64_t bytes;
  };
  const size sizes[] = {{"4 B", 4}, {"1 MiB", 1 << 20}, {"64 MiB", std::uint64_t{64} << 20}};
  std::printf("| ranks | hosts x ranks | collective | size | algorithm | predicted (ms) |\n");
  std::printf("|---|---|---|---|---|---|\n");
  const auto t0 = std::chrono::steady_clock::now();
  try {
    for (const auto& l : layouts)
      for (const char* op : {"allreduce", "broadcast"})
        for (const auto& s : sizes) {
          const auto p = troupe::testing::predict(op, s.bytes, l, costs);
          std::printf("| %d | %d x %d | %s | %s | %s | %.3f |\n", l.hosts * l.ranks_per_host,
                      l.hosts, l.ranks_per_host, op, s.label, p.algorithm.c_str(), p.seconds * 1e3);
        }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "predict_bench: %s\n", e.what());
    return 1;
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\npredict_bench: every prediction above took %.3f s of wall time\n", wall);
  return 0;
}
