#include "troupe/testing.hpp"

#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "api/rank_threads.hpp"
#include "troupe/error.hpp"
#include "troupe/launch.hpp"

namespace troupe::testing {
namespace {

/// Set when a launcher (troupe-run, mpirun, srun) started this process: then
/// the ranks of each run_ranks call are spread over the job's processes.
struct launched_job {
  int process = 0;
  int processes = 1;
  std::shared_ptr<store> base;
  std::uint64_t calls = 0;  // run_ranks calls so far (the same sequence in every process)
};

launched_job* job_of_this_process() {
  // Lives until the process ends and is deliberately never destroyed: its
  // store owns an actor system, which must not be torn down during exit().
  static launched_job* const job = []() -> launched_job* {
    if (!std::getenv("RANK") && !std::getenv("OMPI_COMM_WORLD_RANK") &&
        !std::getenv("SLURM_PROCID"))
      return nullptr;
    auto env = read_launch_env();
    auto* j = new launched_job;
    j->process = env.rank;
    j->processes = env.world_size;
    j->base = make_store("env://", env, std::chrono::seconds(60));
    return j;
  }();
  return job;
}

}  // namespace

void run_ranks(int n, const std::function<void(world&)>& fn, const run_options& opts) {
  if (n < 1)
    throw error(errc::invalid_argument,
                "run_ranks: n " + std::to_string(n) + " must be at least 1");
  // Where the ranks live: all here, or rank r in process r mod P of a launched job.
  std::shared_ptr<store> store;
  int process = 0, processes = 1;
  if (auto* job = job_of_this_process()) {
    process = job->process;
    processes = job->processes;
    store = std::make_shared<prefix_store>("run_ranks/" + std::to_string(++job->calls), job->base);
  } else {
    store = std::make_shared<hash_store>(opts.timeout);
  }
  std::vector<int> local;
  for (int r = process; r < n; r += processes) local.push_back(r);
  if (local.empty()) return;  // more processes than ranks: nothing to run here

  std::mutex mtx;
  std::vector<world*> worlds(static_cast<std::size_t>(n), nullptr);
  std::exception_ptr first;
  int first_rank = -1;
  auto fail = [&](int rank, std::exception_ptr e) {
    std::lock_guard<std::mutex> g{mtx};
    if (!first) {
      first = e;
      first_rank = rank;
    }
    for (auto* w : worlds)
      if (w && w->rank() != rank) w->abort("rank " + std::to_string(rank) + " failed");
  };
  // Worlds stay alive until every rank finished its function: a rank that is
  // done must not take its group actors away from ranks still receiving.
  std::condition_variable all_done_cv;
  std::size_t done = 0;
  auto finish = [&] {
    std::unique_lock<std::mutex> g{mtx};
    if (++done == local.size()) all_done_cv.notify_all();
    all_done_cv.wait(g, [&] { return done == local.size(); });
  };
  std::vector<std::thread> threads;
  for (int r : local)
    threads.emplace_back([&, r] {
      try {
        world w{detail::rank_world_options(store, r, n, opts.backend, opts.timeout)};
        {
          std::lock_guard<std::mutex> g{mtx};
          worlds[static_cast<std::size_t>(r)] = &w;
          if (first) w.abort("rank " + std::to_string(first_rank) + " failed");
        }
        try {
          fn(w);
          // Across processes, also wait for the ranks elsewhere.
          if (processes > 1) w.default_group().barrier().wait();
        } catch (...) {
          fail(r, std::current_exception());
        }
        finish();
        detail::leave_together(w);
        std::lock_guard<std::mutex> g{mtx};
        worlds[static_cast<std::size_t>(r)] = nullptr;
      } catch (...) {
        fail(r, std::current_exception());
        finish();
      }
    });
  for (auto& t : threads) t.join();
  if (!first) return;
  detail::rethrow_prefixed(first, "rank " + std::to_string(first_rank) + ": ");
}

}  // namespace troupe::testing
