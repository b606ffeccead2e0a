// scale_bench — many ranks in one process, as a simulation runs them: each
// of N ranks (its own world, its own actor system) joins, runs 10 allreduces
// of one float (every result checked) and a barrier, then leaves. Prints one
// row per rank count: wall time (set-up and teardown included), threads and
// resident memory of the process once every rank is up, per rank.
//
//   scale_bench [N ...]        (default: 64 256 1024)
#include <troupe/testing.hpp>
#include <troupe/troupe.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace {

long status_field(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = key;
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return std::atol(line.c_str() + k.size());
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> counts;
  for (int i = 1; i < argc; ++i) counts.push_back(std::atoi(argv[i]));
  if (counts.empty()) counts = {64, 256, 1024};
  std::printf(
      "| ranks | time (s) | threads | threads per rank | RSS (MiB) | RSS per rank (KiB) |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (int n : counts) {
    if (n < 1) {
      std::fprintf(stderr, "scale_bench: rank count %d is not positive\n", n);
      return 2;
    }
    const long base_kib = status_field("VmRSS:");
    std::atomic<long> threads{0}, rss{0};
    std::atomic<bool> bad{false};
    const auto t0 = std::chrono::steady_clock::now();
    troupe::testing::run_options o;
    o.timeout = std::chrono::minutes(5);
    troupe::testing::run_ranks(
        n,
        [&](troupe::world& w) {
          auto& g = w.default_group();
          for (int i = 0; i < 10; ++i) {
            auto t = troupe::tensor::from_vector<float>({1.0f});
            g.allreduce(t).wait();
            if (t.to_vector<float>()[0] != float(n)) bad = true;
          }
          // Every rank is up and idle between these barriers: count then.
          g.barrier().wait();
          if (w.rank() == 0) {
            threads = status_field("Threads:");
            rss = status_field("VmRSS:");
          }
          g.barrier().wait();
        },
        o);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (bad) {
      std::fprintf(stderr, "scale_bench: a wrong allreduce result with %d ranks\n", n);
      return 1;
    }
    std::printf("| %d | %.2f | %ld | %.2f | %.0f | %.0f |\n", n, s, threads.load(),
                double(threads.load()) / n, double(rss.load()) / 1024,
                double(rss.load() - base_kib) / n);
    std::fflush(stdout);
  }
}
