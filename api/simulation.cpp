// troupe::testing::simulate and find_failing_seed (include/troupe/simulation.hpp):
// worlds of n ranks in this process whose threads take turns under one
// seeded sim_conductor (base/sim_conductor.hpp).

#include "troupe/simulation.hpp"

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "api/rank_threads.hpp"
#include "api/virtual_clock.hpp"
#include "base/engine_setting.hpp"
#include "base/sim_conductor.hpp"
#include "troupe/error.hpp"
#include "troupe/store.hpp"

namespace troupe::testing {

void simulate(int n, const std::function<void(world&)>& fn, const simulation_options& opts) {
  if (n < 1)
    throw error(errc::invalid_argument, "simulate: n " + std::to_string(n) + " must be at least 1");
  if (detail::read_engine_setting() == detail::engine_setting::actors)
    throw error(errc::invalid_argument,
                "simulate: " + detail::engine_setting_source() +
                    " runs collectives on the group actors, whose threads the schedule cannot "
                    "hold; simulate needs the inline engine (TROUPE_ENGINE=inline or messages)");
  std::vector<detail::sim_conductor::fault_rule> rules;
  for (const auto& f : opts.faults) {
    if (f.rank < 0 || f.rank >= n)
      throw error(errc::invalid_argument, "simulate: a fault names rank " + std::to_string(f.rank) +
                                              " of " + std::to_string(n));
    if (f.at_call < 1)
      throw error(errc::invalid_argument, "simulate: a fault at call " + std::to_string(f.at_call) +
                                              " (calls count from 1)");
    rules.push_back({f.kind == fault::kill, f.rank, f.at_call});
  }
  std::unique_ptr<detail::virtual_clock> clock;
  if (opts.timing) clock = std::make_unique<detail::virtual_clock>(n, *opts.timing);
  auto store = std::make_shared<hash_store>(opts.timeout);
  detail::sim_conductor conductor(n, opts.seed, std::move(rules), opts.schedule);
  conductor.set_clock(clock.get());

  std::mutex mtx;
  std::exception_ptr first;
  int first_rank = -1;
  std::condition_variable done_cv;
  int done = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      std::unique_ptr<world> w;
      bool killed = false;
      try {
        // Set-up runs concurrently, before the turns.
        w = std::make_unique<world>(
            detail::rank_world_options(store, r, n, opts.backend, opts.timeout));
        detail::set_sim_here(&conductor, r);
        conductor.enter(r);
        try {
          fn(*w);
        } catch (const detail::sim_stop& s) {
          killed = s.killed;
          if (killed) w.reset();  // a killed rank's world goes at once, in its turn
        }
      } catch (...) {
        // Only one rank runs at a time: which failed first follows from the seed.
        std::lock_guard<std::mutex> g{mtx};
        if (!first) {
          first = std::current_exception();
          first_rank = r;
        }
      }
      conductor.leave(r, killed);
      detail::set_sim_here(nullptr, -1);
      // Worlds stay until every rank is done (a finished rank's groups may
      // still be read by the others).
      std::unique_lock<std::mutex> g{mtx};
      if (++done == n) done_cv.notify_all();
      done_cv.wait(g, [&] { return done == n; });
      g.unlock();
      if (w) detail::leave_together(*w);
      w.reset();
    });
  for (auto& t : threads) t.join();
  if (clock) clock->report(*opts.timing);
  if (!first) return;
  detail::rethrow_prefixed(
      first, "seed " + std::to_string(opts.seed) + ": rank " + std::to_string(first_rank) + ": ");
}

namespace {

detail::sim_clock& clock_here(const char* op) {
  auto* sim = detail::sim_here();
  if (!sim || !sim->clock())
    throw error(
        errc::invalid_argument,
        std::string(op) +
            ": not a rank of a timed simulation (simulate with simulation_options::timing)");
  return *sim->clock();
}

}  // namespace

double virtual_now() {
  return clock_here("virtual_now").now(detail::sim_rank_here());
}

void virtual_compute(double seconds) {
  clock_here("virtual_compute").compute(detail::sim_rank_here(), seconds);
}

std::optional<std::uint64_t> find_failing_seed(int n, const std::function<void(world&)>& fn,
                                               std::uint64_t first, int count,
                                               const simulation_options& base) {
  for (int i = 0; i < count; ++i) {
    auto o = base;
    o.seed = first + static_cast<std::uint64_t>(i);
    try {
      simulate(n, fn, o);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "find_failing_seed: seed %llu fails: %s\n",
                   static_cast<unsigned long long>(o.seed), e.what());
      return o.seed;
    }
  }
  return std::nullopt;
}

}  // namespace troupe::testing
