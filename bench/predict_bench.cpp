// predict_bench — what troupe would run, and how long it would take, for
// jobs far larger than this machine: testing::predict (the cost model the
// ranks consult when they choose an algorithm) over layouts of hosts, for
// allreduce and broadcast of 4 B, 1 MiB and 64 MiB. Prints one table, and
// the wall time every prediction took together.
//
//   predict_bench [--link-costs COSTS] [HOSTSxRANKS ...]
//
// COSTS: TROUPE_LINK_COSTS's syntax (default: the process's model). Default
// layouts: 128x8, 512x8, 2048x8 (1,024, 4,096 and 16,384 ranks) and 4096x1.
#include <troupe/simulation.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  std::string costs;
  std::vector<troupe::testing::host_layout> layouts;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--link-costs" && i + 1 < argc) {
        costs = argv[++i];
        continue;
      }
      const auto x = a.find('x');
      if (x == std::string::npos) throw std::invalid_argument("'" + a + "' is not HOSTSxRANKS");
      layouts.push_back({std::stoi(a.substr(0, x)), std::stoi(a.substr(x + 1))});
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "predict_bench: %s\nusage: predict_bench [--link-costs C] [HxR ...]\n",
                 e.what());
    return 2;
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
