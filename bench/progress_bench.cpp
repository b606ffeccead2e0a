// progress_bench — asynchronous progress: the time per allreduce when the
// next call is issued from the previous one's continuation (no thread
// waits), against a blocking wait() in a loop, for 4 B and 1 MiB.
//
//   progress_bench --ranks 2               ranks as threads of one process
//   troupe-run -n 2 progress_bench         one rank per process (shared memory)
//   options: --ops K (chained calls per round, default 200) --rounds R (default 5)
//            --check-only (one short round, values checked, no table)
//
// Rows: "wait" issues allreduce(t).wait() K times; "on_complete" issues the
// first call and each next one from the previous one's on_complete, the
// main thread blocking on a condition variable until the K-th completes
// (the embedding of an application that never blocks on a work). Each round
// runs every row once (the machine's slow seconds fall on all rows alike);
// a row's time is the slowest rank's, from a barrier to its last completion,
// divided by K; the table shows the median over the rounds and the ratio
// against "wait" of the same size.

#include <troupe/launch.hpp>
#include <troupe/testing.hpp>
#include <troupe/troupe.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using troupe::tensor;
using clock_type = std::chrono::steady_clock;

struct options {
  int ranks = 2;
  int ops = 200;
  int rounds = 5;
  bool check_only = false;
};

const char* const modes[] = {"wait", "on_complete"};
const std::int64_t sizes[] = {1, 1 << 18};  // float32 elements: 4 B, 1 MiB

/// Runs `ops` allreduces of `t` in `mode`; returns once the last completed.
void chain(troupe::process_group& pg, tensor& t, const std::string& mode, int ops) {
  const troupe::allreduce_options avg{.op = troupe::reduce_op::AVG};
  if (mode == "wait") {
    for (int i = 0; i < ops; ++i) pg.allreduce(t, avg).wait();
    return;
  }
  std::mutex m;
  std::condition_variable cv;
  int left = ops;
  std::exception_ptr failure;
  std::function<void(const troupe::work&)> next = [&](const troupe::work& done) {
    bool last = false;
    {
      std::lock_guard<std::mutex> g{m};
      if (auto e = done.exception(); e && !failure) failure = e;
      last = --left == 0 || failure;
    }
    if (last) return cv.notify_all();
    pg.allreduce(t, avg).on_complete(next);
  };
  pg.allreduce(t, avg).on_complete(next);
  std::unique_lock<std::mutex> g{m};
  if (!cv.wait_for(g, std::chrono::seconds(120), [&] { return left == 0 || failure; }))
    throw std::runtime_error("progress_bench: a chain of " + std::to_string(ops) +
                             " allreduces did not finish in 120 s (" + std::to_string(left) +
                             " left)");
  if (failure) std::rethrow_exception(failure);
}

/// The slowest rank's time per call of one row, in microseconds.
double time_row(troupe::world& w, tensor& t, const std::string& mode, int ops) {
  auto& pg = w.default_group();
  pg.barrier().wait();
  const auto start = clock_type::now();
  chain(pg, t, mode, ops);
  const double us =
      std::chrono::duration<double, std::micro>(clock_type::now() - start).count() / ops;
  auto slowest = tensor::from_vector<double>({us});
  pg.allreduce(slowest, {.op = troupe::reduce_op::MAX}).wait();
  return slowest.to_vector<double>()[0];
}

void run(troupe::world& w, const options& o, bool launched_here) {
  const int n = w.size();
  // results[size][mode][round]
  std::vector<std::vector<std::vector<double>>> results(
      std::size(sizes), std::vector<std::vector<double>>(std::size(modes)));
  const int rounds = o.check_only ? 1 : o.rounds;
  const int ops = o.check_only ? 5 : o.ops;
  for (int round = -1; round < rounds; ++round)  // round -1 warms up
    for (std::size_t si = 0; si < std::size(sizes); ++si)
      for (std::size_t mi = 0; mi < std::size(modes); ++mi) {
        // AVG of the ranks' numbers, then of equal values: (n - 1) / 2
        // throughout, exact; checked on the first and last element.
        auto t = tensor::from_vector(std::vector<float>(std::size_t(sizes[si]), float(w.rank())));
        const double us = time_row(w, t, modes[mi], ops);
        const auto v = t.to_vector<float>();
        const float expect = float(n - 1) / 2;
        const float first = v.front() != expect ? v.front() : v.back();
        if (first != expect)
          throw std::runtime_error(std::string("progress_bench: ") + modes[mi] + " of " +
                                   std::to_string(sizes[si] * 4) + " B gave " +
                                   std::to_string(first) + ", expected " + std::to_string(expect));
        if (round >= 0) results[si][mi].push_back(us);
      }
  if (w.rank() != 0 || o.check_only) {
    if (w.rank() == 0) std::printf("progress_bench: values checked\n");
    return;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  std::printf(
      "\n### continuations: allreduce (float32) per call, %d ranks (%s), %d chained calls, "
      "median of %d rounds\n\n",
      n, launched_here ? "one process per rank" : "threads of one process", ops, rounds);
  std::printf("%-8s | %-12s | %12s | %9s\n", "size", "issued from", "us per call", "vs wait");
  for (std::size_t si = 0; si < std::size(sizes); ++si) {
    const double base = median(results[si][0]);
    for (std::size_t mi = 0; mi < std::size(modes); ++mi) {
      const double m = median(results[si][mi]);
      std::printf("%-8s | %-12s | %12.2f | %8.2fx\n", sizes[si] == 1 ? "4 B" : "1 MiB", modes[mi],
                  m, m / base);
    }
  }
  std::printf(
      "\nwait: allreduce(t).wait() in a loop; on_complete: each call issued from the\n"
      "previous one's on_complete (no thread waits on a work). AVG, values checked.\n"
      "Target: on_complete within 2x of wait.\n");
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(a + " expects a value");
      return std::atoi(argv[++i]);
    };
    if (a == "--ranks")
      o.ranks = value();
    else if (a == "--ops")
      o.ops = value();
    else if (a == "--rounds")
      o.rounds = value();
    else if (a == "--check-only")
      o.check_only = true;
    else
      throw std::invalid_argument("unknown option '" + a +
                                  "' (--ranks N, --ops K, --rounds R, --check-only)");
  }
  if (o.ranks < 1 || o.ops < 1 || o.rounds < 1)
    throw std::invalid_argument("--ranks, --ops, --rounds >= 1");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto o = parse(argc, argv);
    troupe::run_job(o.ranks, [&](troupe::world& w, bool launched) { run(w, o, launched); },
                    {.timeout = std::chrono::seconds(300)});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "progress_bench FAILED: %s\n", e.what());
    return 1;
  }
  return 0;
}
