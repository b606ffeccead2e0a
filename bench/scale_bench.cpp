// scale_bench — many ranks in one process, as a simulation runs them: each
// of N ranks (its own world, its own actor system) joins, runs 10 allreduces
// of one float, then every other collective once (broadcast, reduce,
// allgather, reduce_scatter, alltoall, gatherv, scatterv) and a ring of
// point-to-point messages, every result checked, and a barrier, then leaves.
// Prints one row per rank count: wall time (set-up and teardown included),
// threads and resident memory of the process once every rank is up and idle,
// per rank.
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

using troupe::tensor;

/// Every other collective once and a point-to-point ring, checked; "" when
/// every result is right, else what was wrong.
std::string check_every_call(troupe::world& w) {
  auto& g = w.default_group();
  const int n = g.size(), r = g.rank();
  auto f32 = [](std::vector<float> v) { return tensor::from_vector<float>(std::move(v)); };
  auto wrong = [&](const char* op, int at, float got, float want) {
    return std::string(op) + " on rank " + std::to_string(r) + ": element " + std::to_string(at) +
           " is " + std::to_string(got) + ", expected " + std::to_string(want);
  };
  auto b = f32({r == n - 1 ? 7.0f : 0.0f});
  g.broadcast(b, n - 1).wait();
  if (b.to_vector<float>()[0] != 7.0f) return wrong("broadcast", 0, b.to_vector<float>()[0], 7);
  auto red = f32({1.0f});
  g.reduce(red, 0).wait();
  if (r == 0 && red.to_vector<float>()[0] != float(n))
    return wrong("reduce", 0, red.to_vector<float>()[0], float(n));
  auto all = tensor::zeros({n}, troupe::dtype::float32);
  g.allgather_into_tensor(all, f32({float(r)})).wait();
  for (int i = 0; i < n; ++i)
    if (all.to_vector<float>()[static_cast<std::size_t>(i)] != float(i))
      return wrong("allgather", i, all.to_vector<float>()[static_cast<std::size_t>(i)], float(i));
  std::vector<float> ones(static_cast<std::size_t>(n), float(r + 1));
  auto part = f32({0.0f});
  g.reduce_scatter_tensor(part, f32(ones)).wait();
  const float sum = float(n) * float(n + 1) / 2;
  if (part.to_vector<float>()[0] != sum)
    return wrong("reduce_scatter", 0, part.to_vector<float>()[0], sum);
  std::vector<float> mine(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) mine[static_cast<std::size_t>(j)] = float(r * n + j);
  auto got = tensor::zeros({n}, troupe::dtype::float32);
  g.alltoall_single(got, f32(mine)).wait();
  for (int j = 0; j < n; ++j)
    if (got.to_vector<float>()[static_cast<std::size_t>(j)] != float(j * n + r))
      return wrong("alltoall", j, got.to_vector<float>()[static_cast<std::size_t>(j)],
                   float(j * n + r));
  const std::vector<std::int64_t> counts(static_cast<std::size_t>(n), 1);
  auto gathered = r == 0 ? tensor::zeros({n}, troupe::dtype::float32) : tensor{};
  g.gatherv(gathered, f32({float(r)}), counts, {.root_rank = 0}).wait();
  if (r == 0)
    for (int i = 0; i < n; ++i)
      if (gathered.to_vector<float>()[static_cast<std::size_t>(i)] != float(i))
        return wrong("gatherv", i, gathered.to_vector<float>()[static_cast<std::size_t>(i)],
                     float(i));
  auto piece = f32({-1.0f});
  g.scatterv(piece, r == 0 ? all : tensor{}, counts, {.root_rank = 0}).wait();
  if (piece.to_vector<float>()[0] != float(r))
    return wrong("scatterv", 0, piece.to_vector<float>()[0], float(r));
  if (n > 1) {
    auto out = f32({float(r)}), in = f32({-1.0f});
    g.batch_isend_irecv(
         {{troupe::p2p_op::isend, out, (r + 1) % n}, {troupe::p2p_op::irecv, in, (r + n - 1) % n}})
        .wait();
    if (in.to_vector<float>()[0] != float((r + n - 1) % n))
      return wrong("send/recv ring", 0, in.to_vector<float>()[0], float((r + n - 1) % n));
  }
  return {};
}

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
          if (auto why = check_every_call(w); !why.empty()) {
            std::fprintf(stderr, "scale_bench: %d ranks: %s\n", n, why.c_str());
            bad = true;
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
      std::fprintf(stderr, "scale_bench: a wrong result with %d ranks\n", n);
      return 1;
    }
    std::printf("| %d | %.2f | %ld | %.2f | %.0f | %.0f |\n", n, s, threads.load(),
                double(threads.load()) / n, double(rss.load()) / 1024,
                double(rss.load() - base_kib) / n);
    std::fflush(stdout);
  }
}
