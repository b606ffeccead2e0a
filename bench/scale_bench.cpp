// scale_bench — many ranks in one process, as a simulation runs them: each
// of N ranks (its own world, its own actor system) joins, makes a group of
// every rank, runs 10 allreduces of one float, then every other collective
// once (broadcast, reduce, allgather, reduce_scatter, alltoall, gatherv,
// scatterv) and a ring of point-to-point messages, every result checked, and
// a barrier, then leaves.
//
// Each rank count runs in a child process of its own, so that its peak
// memory (VmHWM) is its own and a count that fails or hangs does not stop
// the others. One row per rank count: the time of each phase — the worlds
// built (threads started, the rendezvous through the store, the default
// group), a new group of every rank, the first allreduce, one allreduce
// after it, every other call, tear-down (the worlds destroyed) — each phase
// ending when its last rank ends it; then the threads and resident memory
// of the process once every rank is up and idle, and its peak, per rank.
//
//   scale_bench [--timeout-s S] [--no-fork] [N ...]   (default: 1024 2048 4096)
//
// S bounds every collective and the set-up of one count (default 600); a
// count whose child has not ended 60 s after that is stopped and reported.
// --no-fork runs every count in this process (for profilers that do not
// follow a fork; the peak memory is then the largest count's so far).
#include <troupe/testing.hpp>
#include <troupe/troupe.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using troupe::tensor;
using clk = std::chrono::steady_clock;

/// Every other collective once and a point-to-point ring, checked; "" when
/// every result is right, else what was wrong.
std::string check_every_call(troupe::process_group& g) {
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
  const auto gathered_all = all.to_vector<float>();
  for (int i = 0; i < n; ++i)
    if (gathered_all[static_cast<std::size_t>(i)] != float(i))
      return wrong("allgather", i, gathered_all[static_cast<std::size_t>(i)], float(i));
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
  const auto received = got.to_vector<float>();
  for (int j = 0; j < n; ++j)
    if (received[static_cast<std::size_t>(j)] != float(j * n + r))
      return wrong("alltoall", j, received[static_cast<std::size_t>(j)], float(j * n + r));
  const std::vector<std::int64_t> counts(static_cast<std::size_t>(n), 1);
  auto gathered = r == 0 ? tensor::zeros({n}, troupe::dtype::float32) : tensor{};
  g.gatherv(gathered, f32({float(r)}), counts, {.root_rank = 0}).wait();
  if (r == 0) {
    const auto v = gathered.to_vector<float>();
    for (int i = 0; i < n; ++i)
      if (v[static_cast<std::size_t>(i)] != float(i))
        return wrong("gatherv", i, v[static_cast<std::size_t>(i)], float(i));
  }
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

/// The phases of one run, each ending when its last rank ends it.
enum phase { worlds, group, first_call, steady, every_call, left, phases };
const char* const phase_names[phases] = {"worlds built", "group of every rank", "first allreduce",
                                         "10 allreduces",  "every other call",  "functions ended"};

struct phase_clock {
  clk::time_point t0 = clk::now();
  std::atomic<long long> end_ns[phases] = {};
  std::atomic<int> reached[phases] = {};
  int n = 0;

  /// This rank ended phase `p`; the last one says so on stderr (where a
  /// count that does not finish stopped).
  void mark(phase p) {
    const long long ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now() - t0).count();
    long long seen = end_ns[p].load();
    while (seen < ns && !end_ns[p].compare_exchange_weak(seen, ns)) {
    }
    if (reached[p].fetch_add(1) + 1 == n)
      std::fprintf(stderr, "scale_bench: %d ranks: %s at %.2f s\n", n, phase_names[p],
                   double(end_ns[p].load()) / 1e9);
  }
  double seconds(phase p) const {
    return double(end_ns[p].load() - (p == worlds ? 0 : end_ns[p - 1].load())) / 1e9;
  }
};

/// Runs `n` ranks in this process and prints their row; the exit status says
/// whether every result was right.
int run_count(int n, std::chrono::seconds timeout) {
  const long base_kib = status_field("VmRSS:");
  std::atomic<long> threads{0}, rss{0};
  std::atomic<bool> bad{false};
  phase_clock pc;
  pc.n = n;
  troupe::testing::run_options o;
  o.timeout = timeout;
  troupe::testing::run_ranks(
      n,
      [&](troupe::world& w) {
        pc.mark(worlds);
        std::vector<int> everyone(static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) everyone[static_cast<std::size_t>(r)] = r;
        auto all = w.new_group(everyone);
        pc.mark(group);
        auto& g = w.default_group();
        auto allreduce_one = [&] {
          auto t = troupe::tensor::from_vector<float>({1.0f});
          g.allreduce(t).wait();
          if (t.to_vector<float>()[0] != float(n)) bad = true;
        };
        allreduce_one();
        pc.mark(first_call);
        for (int i = 0; i < 10; ++i) allreduce_one();
        pc.mark(steady);
        if (auto why = check_every_call(*all); !why.empty()) {
          std::fprintf(stderr, "scale_bench: %d ranks: %s\n", n, why.c_str());
          bad = true;
        }
        pc.mark(every_call);
        // Every rank is up and idle between these barriers: count then.
        g.barrier().wait();
        if (w.rank() == 0) {
          threads = status_field("Threads:");
          rss = status_field("VmRSS:");
        }
        g.barrier().wait();
        pc.mark(left);
      },
      o);
  const double total = std::chrono::duration<double>(clk::now() - pc.t0).count();
  const double teardown = total - double(pc.end_ns[left].load()) / 1e9;
  const long hwm = status_field("VmHWM:");
  if (bad) {
    std::fprintf(stderr, "scale_bench: a wrong result with %d ranks\n", n);
    return 1;
  }
  // Phase "functions ended" is the barriers around the count: not a column.
  std::printf(
      "| %d | %.2f | %.2f | %.2f | %.1f | %.2f | %.2f | %.2f | %ld | %.2f | %.0f | %.0f | %.0f | "
      "%.0f |\n",
      n, total, pc.seconds(worlds), pc.seconds(group), pc.seconds(first_call) * 1e3,
      pc.seconds(steady) / 10 * 1e3, pc.seconds(every_call), teardown, threads.load(),
      double(threads.load()) / n, double(rss.load()) / 1024, double(rss.load() - base_kib) / n,
      double(hwm) / 1024, double(hwm - base_kib) / n);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> counts;
  std::chrono::seconds timeout{600};
  bool fork_each = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-fork") == 0) {
      fork_each = false;
      continue;
    }
    if (std::strcmp(argv[i], "--timeout-s") == 0 && i + 1 < argc) {
      timeout = std::chrono::seconds(std::atol(argv[++i]));
      if (timeout.count() < 1) {
        std::fprintf(stderr, "scale_bench: --timeout-s %s is not a positive number of seconds\n",
                     argv[i]);
        return 2;
      }
      continue;
    }
    const int n = std::atoi(argv[i]);
    if (n < 1) {
      std::fprintf(stderr, "scale_bench: rank count '%s' is not a positive number\n", argv[i]);
      return 2;
    }
    counts.push_back(n);
  }
  if (counts.empty()) counts = {1024, 2048, 4096};
  std::printf(
      "| ranks | total (s) | worlds (s) | group (s) | first allreduce (ms) | allreduce (ms) | "
      "every other call (s) | tear-down (s) | threads | per rank | VmRSS (MiB) | per rank (KiB) "
      "| VmHWM (MiB) | per rank (KiB) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  int status = 0;
  for (int n : counts) {
    if (!fork_each) {
      if (run_count(n, timeout) != 0) status = 1;
      continue;
    }
    const pid_t child = ::fork();
    if (child < 0) {
      std::perror("scale_bench: fork");
      return 2;
    }
    if (child == 0) {
      int rc = 1;
      try {
        rc = run_count(n, timeout);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "scale_bench: %d ranks failed: %s\n", n, e.what());
      }
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(rc);
    }
    // The child's own timeouts end it; this bounds a child that hangs anyway.
    const auto limit = clk::now() + timeout + std::chrono::seconds(60);
    int ws = 0;
    while (::waitpid(child, &ws, WNOHANG) == 0) {
      if (clk::now() > limit) {
        ::kill(child, SIGKILL);
        ::waitpid(child, &ws, 0);
        std::printf("| %d | did not finish in %lld s |\n", n,
                    static_cast<long long>(timeout.count() + 60));
        std::fflush(stdout);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!(WIFEXITED(ws) && WEXITSTATUS(ws) == 0)) {
      if (WIFSIGNALED(ws) && WTERMSIG(ws) != SIGKILL)
        std::fprintf(stderr, "scale_bench: %d ranks: killed by signal %d\n", n, WTERMSIG(ws));
      status = 1;
    }
  }
  return status;
}
