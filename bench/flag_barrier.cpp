// flag_barrier — the least time of a call that every rank must hear of from
// every other rank, measured on this machine without troupe.
//
// troupe completes no collective before every rank knows what every other
// rank called (the agreement: a mismatch fails on every rank alike), so any
// of its collectives costs at least a barrier of its ranks. This program
// forks n processes that share one page and times the plainest barrier there
// is: a counter in one cache line that every rank increments and the last
// one's arrival turns into a new generation, which the others wait for. It
// follows the collectives benchmark's protocol exactly (bench_common.cpp
// run_rank): each iteration is a barrier, then the timed barrier; the time of
// an iteration is its slowest rank's, a record holds the median.
//
// The waiters are measured two ways, and the record is the faster:
//   spin  — poll the generation without pause (best while every process has
//           a CPU of its own; only then);
//   yield — sched_yield between polls (what a spinning MPI does when ranks
//           outnumber CPUs: the CPU goes to a rank that has yet to arrive).
// Each with the processes free and, when there are CPUs enough, bound to a
// CPU each (as troupe-run and mpirun place them then). (Sleeping on a futex
// measured 40-50 us with 2 to 7 processes here, spinning a few hundred polls
// before yielding 4-5x slower with 4 processes on 2 CPUs: neither kept.)
//
//   flag_barrier [--ranks n] [--iters K] [--csv F]
//
// Record: system "flag-barrier", transport "shm", ranks n, op "barrier",
// 0 bytes, appended to F; the report bounds the time of every small
// collective of n processes by it.

#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/futex.hpp"
#include "bench_common.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using troupe::detail::cpu_relax;

/// No wait lasts longer: a rank that died fails the others instead of
/// hanging them.
constexpr std::chrono::seconds wait_limit{20};
/// Polls between two readings of the clock (the wait's limit).
constexpr int polls_per_check = 1024;
/// Untimed barriers first (the same count on every rank: tens of
/// milliseconds, as the benchmark warms up).
constexpr int warmup_iters = 5000;

enum class waiting { spin, yield };

const char* waiting_name(waiting w) {
  return w == waiting::spin ? "spin" : "yield";
}

/// The shared page: the barrier's line, then every rank's times.
struct shared {
  alignas(64) std::atomic<std::uint32_t> arrived{0};
  alignas(64) std::atomic<std::uint32_t> generation{0};
  alignas(64) std::atomic<int> failed{0};
  // times[rank * iters + it], in microseconds, after the header.
};

class barrier {
 public:
  barrier(shared& s, int ranks, waiting w) : s_(s), ranks_(std::uint32_t(ranks)), w_(w) {}

  /// Returns once every rank arrived; throws after wait_limit or when
  /// another rank failed.
  void arrive() {
    const std::uint32_t gen = s_.generation.load(std::memory_order_acquire);
    if (s_.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == ranks_) {
      s_.arrived.store(0, std::memory_order_relaxed);
      s_.generation.store(gen + 1, std::memory_order_release);
      return;
    }
    const auto deadline = clock_type::now() + wait_limit;
    for (int i = 1; s_.generation.load(std::memory_order_acquire) == gen; ++i) {
      if (w_ == waiting::yield)
        ::sched_yield();
      else
        cpu_relax();
      if (i % polls_per_check) continue;
      if (s_.failed.load(std::memory_order_relaxed))
        throw std::runtime_error("another rank failed");
      if (clock_type::now() > deadline)
        throw std::runtime_error("a rank did not arrive within " +
                                 std::to_string(wait_limit.count()) + " s");
    }
  }

 private:
  shared& s_;
  std::uint32_t ranks_;
  waiting w_;
};

void bind_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof(set), &set) != 0)
    throw std::runtime_error(std::string("sched_setaffinity: ") + std::strerror(errno));
}

/// One rank: warm up, then `iters` times a barrier and the timed barrier.
void time_barriers(shared& s, double* times, int rank, int ranks, int iters, waiting w,
                   bool bound) {
  if (bound) bind_to(rank);
  barrier b(s, ranks, w);
  for (int it = 0; it < warmup_iters; ++it) b.arrive();
  for (int it = 0; it < iters; ++it) {
    b.arrive();
    const auto t0 = clock_type::now();
    b.arrive();
    times[rank * iters + it] =
        std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
  }
}

/// The median over iterations of the slowest rank's time, in microseconds.
double measure(int ranks, int iters, waiting w, bool bound) {
  const std::size_t bytes = sizeof(shared) + sizeof(double) * std::size_t(ranks) * iters;
  void* page = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) throw std::runtime_error(std::string("mmap: ") + std::strerror(errno));
  auto* s = new (page) shared;
  auto* times = reinterpret_cast<double*>(static_cast<char*>(page) + sizeof(shared));
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
      int code = 0;
      try {
        time_barriers(*s, times, r, ranks, iters, w, bound);
      } catch (const std::exception& e) {
        s->failed.store(1);
        std::fprintf(stderr, "flag_barrier: rank %d: %s\n", r, e.what());
        code = 1;
      }
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  std::vector<double> slowest(std::size_t(iters), 0.0);
  for (int r = 0; r < ranks; ++r)
    for (int it = 0; it < iters; ++it)
      slowest[std::size_t(it)] = std::max(slowest[std::size_t(it)], times[r * iters + it]);
  ::munmap(page, bytes);
  if (!ok) throw std::runtime_error("a rank failed");
  return bench::median(slowest);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int ranks = 2, iters = 2000;
    std::string csv;
    for (int i = 1; i < argc; ++i) {
      const std::string f = argv[i];
      if (i + 1 >= argc) throw std::invalid_argument(f + " expects a value");
      const std::string v = argv[++i];
      if (f == "--ranks") {
        ranks = std::atoi(v.c_str());
        if (ranks < 2 || ranks > 64)
          throw std::invalid_argument("--ranks expects 2 to 64, got '" + v + "'");
      } else if (f == "--iters") {
        iters = std::atoi(v.c_str());
        if (iters < 1) throw std::invalid_argument("--iters expects a positive integer");
      } else if (f == "--csv") {
        csv = v;
      } else {
        throw std::invalid_argument("unknown argument '" + f + "'");
      }
    }
    const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
    double best = 0;
    for (waiting w : {waiting::spin, waiting::yield})
      for (bool bound : {false, true}) {
        // More processes than CPUs: a spinning waiter keeps its CPU from the
        // ranks yet to arrive until the scheduler's tick (8 ms a barrier).
        if ((bound || w == waiting::spin) && ranks > cpus) continue;
        const double us = measure(ranks, iters, w, bound);
        std::printf("flag barrier of %d processes, %-5s %-5s: %8.3f us\n", ranks, waiting_name(w),
                    bound ? "bound" : "free", us);
        best = best == 0 ? us : std::min(best, us);
      }
    const std::vector<bench::record> rows{
        {"flag-barrier", "shm", ranks, "barrier", 0, iters, best, 0, 0}};
    bench::print_records(rows);
    if (!csv.empty()) bench::append_csv(csv, rows);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flag_barrier: %s\n", e.what());
    return 1;
  }
}
