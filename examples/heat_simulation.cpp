// heat_simulation — a simulation driven by ranks that are actor systems: the
// 1-D heat equation u_t = u_xx on a rod whose left end is held at 1 and right
// end at 0, split over in-process ranks. Every step each rank swaps its edge
// cells with its neighbours (batch_isend_irecv of halo cells) and updates its
// own cells; every few steps the ranks agree on convergence with an allreduce
// MAX of their local change. Rank 0 gathers the field (gatherv) and checks it
// against a serial solve of the same scheme.
//
//   heat_simulation [--ranks N (4)] [--cells M (48)] [--tol T (1e-6)]
//   troupe-run -n N heat_simulation [--cells M] [--tol T]
//
// By default the ranks are threads of this process. Started by a launcher
// (troupe-run, mpirun, srun) each process is one rank, its world from
// troupe::init_world(); rank 0 checks and broadcasts the verdict, so every
// rank's exit code says whether the parallel solve matched.
//
// Recovery (--checkpoint K): every K steps the ranks gather the whole rod
// into each rank's memory (a replicated checkpoint; the last two are kept).
// When a rank dies, the survivors' calls fail; they agree on who is left
// (world::shrink), on the newest checkpoint every one of them holds (an
// allreduce MIN), split the rod over themselves and go on from there, so the
// answer still matches the serial solve bit for bit. --kill-rank R
// --kill-step S makes world rank R die at step S: in one process its world is
// destroyed, under a launcher its process kills itself (SIGKILL; start with
// troupe-run --keep-going so the others go on).
//
//   heat_simulation --ranks 4 --checkpoint 50 --kill-rank 2 --kill-step 120
//   troupe-run --keep-going -n 4 heat_simulation --checkpoint 50 --kill-rank 2 --kill-step 120

#include <troupe/launch.hpp>
#include <troupe/testing.hpp>
#include <troupe/troupe.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using troupe::p2p_op;
using troupe::tensor;

struct params {
  int ranks = 4;
  bool ranks_given = false;
  int cells = 48;
  double tol = 1e-6;
  double k = 0.4;          // dt / dx^2; explicit Euler is stable up to 0.5
  int check_every = 10;    // steps between convergence checks
  int max_steps = 500000;  // give up after this many
  int checkpoint = 0;      // steps between checkpoints (0: none, no recovery)
  int kill_rank = -1;      // world rank that dies at kill_step (-1: none)
  int kill_step = 0;
};

/// The whole rod's interior cells after `step` steps, held by every rank.
struct checkpoint {
  int step = 0;
  std::vector<double> rod;
};

/// What a rank keeps to recover from: the newest two checkpoints.
struct recovery {
  checkpoint last, prev;
};

/// Thrown on the rank that --kill-rank/--kill-step picked, in one process.
struct killed {};

/// One explicit Euler step of cell u[i] from its neighbours.
double update(double left, double mid, double right, double k) {
  return mid + k * (left - 2.0 * mid + right);
}

struct solution {
  std::vector<double> u;  // interior cells
  int steps = 0;
  double residual = 0;  // max change over one step at the last check
};

/// The reference: the same scheme on one rank, no messages.
solution solve_serial(const params& p) {
  std::vector<double> u(static_cast<std::size_t>(p.cells) + 2, 0.0), next = u;
  u[0] = next[0] = 1.0;
  for (int step = 1; step <= p.max_steps; ++step) {
    double change = 0;
    for (std::size_t i = 1; i + 1 < u.size(); ++i) {
      next[i] = update(u[i - 1], u[i], u[i + 1], p.k);
      change = std::max(change, std::fabs(next[i] - u[i]));
    }
    std::swap(u, next);
    if (step % p.check_every == 0 && change < p.tol)
      return {std::vector<double>(u.begin() + 1, u.end() - 1), step, change};
  }
  throw std::runtime_error("serial solve did not converge in " + std::to_string(p.max_steps) +
                           " steps");
}

/// Cells owned by each of `ranks` ranks (the first cells % ranks get one more).
std::vector<std::int64_t> partition(const params& p, int ranks) {
  std::vector<std::int64_t> counts;
  for (int r = 0; r < ranks; ++r) counts.push_back(p.cells / ranks + (r < p.cells % ranks));
  return counts;
}

/// One rank's part of the simulation on group `pg`, from checkpoint `from`
/// (step 0: the cold rod); the group's rank 0 returns the whole field.
solution simulate(troupe::world& w, troupe::process_group& pg, const params& p, recovery& saved) {
  const int r = pg.rank(), n = pg.size();
  const auto counts = partition(p, n);
  const std::int64_t m = counts[static_cast<std::size_t>(r)];
  std::int64_t offset = 0;
  for (int q = 0; q < r; ++q) offset += counts[static_cast<std::size_t>(q)];
  // Local cells 1..m plus one ghost cell on each side (the neighbours' edge cells).
  auto field = tensor::zeros({m + 2}, troupe::dtype::float64);
  double* u = field.data_as<double>();
  if (r == 0) u[0] = 1.0;  // the hot end of the rod
  const auto& from = saved.last;
  if (!from.rod.empty()) std::copy(from.rod.begin() + offset, from.rod.begin() + offset + m, u + 1);
  std::vector<double> next(static_cast<std::size_t>(m) + 2);
  auto change = tensor::zeros({1}, troupe::dtype::float64);
  auto rod = tensor::zeros({p.cells}, troupe::dtype::float64);

  for (int step = from.step + 1; step <= p.max_steps; ++step) {
    if (w.rank() == p.kill_rank && step == p.kill_step) {
      std::printf("heat_simulation: world rank %d dies at step %d\n", w.rank(), step);
      std::fflush(stdout);
      if (troupe::launched_by_launcher()) std::raise(SIGKILL);
      throw killed{};
    }
    // Halo exchange: send my edge cells, receive the neighbours' into my ghosts.
    std::vector<p2p_op> halo;
    if (r > 0) {
      halo.push_back({p2p_op::isend, field.flat_slice(1, 1), r - 1});
      halo.push_back({p2p_op::irecv, field.flat_slice(0, 1), r - 1});
    }
    if (r < n - 1) {
      halo.push_back({p2p_op::isend, field.flat_slice(m, 1), r + 1});
      halo.push_back({p2p_op::irecv, field.flat_slice(m + 1, 1), r + 1});
    }
    if (!halo.empty()) pg.batch_isend_irecv(halo).wait();

    // Update my cells.
    double local_change = 0;
    for (std::int64_t i = 1; i <= m; ++i) {
      next[static_cast<std::size_t>(i)] = update(u[i - 1], u[i], u[i + 1], p.k);
      local_change = std::max(local_change, std::fabs(next[static_cast<std::size_t>(i)] - u[i]));
    }
    std::copy(next.begin() + 1, next.begin() + 1 + m, u + 1);

    // Every K steps: every rank keeps the whole rod (the newest two).
    if (p.checkpoint > 0 && step % p.checkpoint == 0) {
      pg.allgatherv(rod, field.flat_slice(1, m), counts).wait();
      saved.prev = std::move(saved.last);
      saved.last = {step, rod.to_vector<double>()};
    }

    // Every few steps: converged when the largest change anywhere is below tol.
    if (step % p.check_every == 0) {
      change.data_as<double>()[0] = local_change;
      pg.allreduce(change, troupe::reduce_op::MAX).wait();
      const double global = change.data_as<double>()[0];
      if (r == 0 && step % (p.check_every * 100) == 0 && p.kill_rank < 0)
        std::printf("  step %6d: max change %.3e\n", step, global);
      if (global < p.tol) {
        // Collect the field on rank 0.
        auto all = r == 0 ? tensor::zeros({p.cells}, troupe::dtype::float64) : tensor{};
        pg.gatherv(all, field.flat_slice(1, m), counts, {.root_rank = 0}).wait();
        solution s;
        s.steps = step;
        s.residual = global;
        if (r == 0) s.u = all.to_vector<double>();
        return s;
      }
    }
  }
  throw std::runtime_error("no convergence in " + std::to_string(p.max_steps) + " steps");
}

params parse(int argc, char** argv) {
  params p;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument("missing value after " + a);
    const char* v = argv[++i];
    if (a == "--ranks") {
      p.ranks = std::atoi(v);
      p.ranks_given = true;
    } else if (a == "--cells") {
      p.cells = std::atoi(v);
    } else if (a == "--tol") {
      p.tol = std::atof(v);
    } else if (a == "--checkpoint") {
      p.checkpoint = std::atoi(v);
    } else if (a == "--kill-rank") {
      p.kill_rank = std::atoi(v);
    } else if (a == "--kill-step") {
      p.kill_step = std::atoi(v);
    } else {
      throw std::invalid_argument("unknown argument " + a);
    }
  }
  if (p.ranks < 1 || !(p.tol > 0)) throw std::invalid_argument("need ranks >= 1 and tol > 0");
  if (p.checkpoint < 0 || (p.checkpoint > 0 && p.checkpoint % p.check_every != 0))
    throw std::invalid_argument("--checkpoint " + std::to_string(p.checkpoint) +
                                " must be a positive multiple of " + std::to_string(p.check_every));
  if (p.kill_rank >= 0 && (p.kill_rank >= p.ranks && !troupe::launched_by_launcher()))
    throw std::invalid_argument("--kill-rank " + std::to_string(p.kill_rank) +
                                " is not a rank of " + std::to_string(p.ranks));
  if (p.kill_rank >= 0 && p.kill_step < 1)
    throw std::invalid_argument("--kill-step " + std::to_string(p.kill_step) + " must be >= 1");
  return p;
}

void check_cells(const params& p) {
  if (p.cells < p.ranks) throw std::invalid_argument("need cells >= ranks");
}

/// Rank 0's check of the gathered field against the serial solve.
bool matches_serial(const params& p, const solution& parallel) {
  const auto serial = solve_serial(p);
  double diff = 0, from_steady = 0;
  for (std::size_t i = 0; i < serial.u.size(); ++i) {
    diff = std::max(diff, std::fabs(parallel.u[i] - serial.u[i]));
    const double x = static_cast<double>(i + 1) / (p.cells + 1);
    from_steady = std::max(from_steady, std::fabs(parallel.u[i] - (1.0 - x)));
  }
  std::printf("converged after %d steps, final residual %.3e (serial: %d steps, %.3e)\n",
              parallel.steps, parallel.residual, serial.steps, serial.residual);
  std::printf("max |parallel - serial| = %.3e, max |u - steady state| = %.3e\n", diff, from_steady);
  if (parallel.steps != serial.steps || diff > 1e-12) {
    std::fprintf(stderr,
                 "heat_simulation FAILED: the parallel solve differs from the serial one\n");
    return false;
  }
  std::printf("heat_simulation: matches the serial solve\n");
  return true;
}

/// Runs the simulation on this rank, recovering from the death of others
/// (with checkpoints): returns the group it finished on and the solution.
std::pair<std::shared_ptr<troupe::process_group>, solution> run_recovering(troupe::world& w,
                                                                           const params& p) {
  recovery saved;
  std::shared_ptr<troupe::process_group> owned;
  troupe::process_group* pg = &w.default_group();
  for (;;) {
    try {
      auto s = simulate(w, *pg, p, saved);
      return {owned, std::move(s)};
    } catch (const troupe::error& e) {
      const bool lost = e.code() == troupe::errc::peer_failure ||
                        e.code() == troupe::errc::aborted || e.code() == troupe::errc::timeout;
      if (!lost || p.checkpoint == 0) throw;
      std::printf("heat_simulation: world rank %d recovers: %s\n", w.rank(), e.what());
      owned = w.shrink(*pg, std::chrono::seconds(20));
      pg = owned.get();
      // Resume from the newest checkpoint every survivor holds.
      auto newest = tensor::from_vector<std::int64_t>({saved.last.step});
      pg->allreduce(newest, troupe::reduce_op::MIN).wait();
      const auto step = newest.data_as<std::int64_t>()[0];
      if (step != saved.last.step) saved.last = saved.prev;
      if (saved.last.step != step)
        throw std::runtime_error("no common checkpoint with the other survivors");
      if (pg->rank() == 0)
        std::printf("heat_simulation: %d survivors resume from step %lld\n", pg->size(),
                    static_cast<long long>(step));
    }
  }
}

/// In one process with a rank that dies: a thread and a world per rank, so
/// that the dying rank's world can go while the others recover.
int run_threads_recovering(params p) {
  auto st = std::make_shared<troupe::hash_store>();
  std::vector<std::thread> threads;
  solution result;
  std::atomic<bool> failed{false};
  for (int r = 0; r < p.ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        troupe::world_options o;
        o.store = st;
        o.rank = r;
        o.world_size = p.ranks;
        o.timeout = std::chrono::seconds(20);
        auto w = std::make_unique<troupe::world>(o);
        auto [g, s] = run_recovering(*w, p);
        troupe::process_group& pg = g ? *g : w->default_group();
        if (pg.rank() == 0) result = std::move(s);
        pg.barrier().wait();  // nobody leaves before the gather's root has its field
      } catch (const killed&) {
        // This rank dies: its world goes with this thread.
      } catch (const std::exception& e) {
        std::fprintf(stderr, "heat_simulation: rank %d FAILED: %s\n", r, e.what());
        failed = true;
      }
    });
  for (auto& t : threads) t.join();
  if (failed) return 1;
  return matches_serial(p, result) ? 0 : 1;
}

/// Under a launcher: this process is one rank; rank 0 checks, everyone learns the verdict.
int run_launched(params p) {
  auto w = troupe::init_world({.timeout = std::chrono::seconds(120)});
  if (p.ranks_given && p.ranks != w->size())
    throw std::invalid_argument("--ranks " + std::to_string(p.ranks) +
                                " does not match the launched job's " + std::to_string(w->size()) +
                                " ranks");
  p.ranks = w->size();
  check_cells(p);
  if (w->rank() == 0)
    std::printf("heat_simulation: %d cells on %d ranks, one per process, tol %.1e\n", p.cells,
                p.ranks, p.tol);
  auto [g, s] = run_recovering(*w, p);
  troupe::process_group& pg = g ? *g : w->default_group();
  auto ok = troupe::tensor::from_vector<std::int32_t>({1});
  if (pg.rank() == 0) ok.data_as<std::int32_t>()[0] = matches_serial(p, s) ? 1 : 0;
  std::fflush(stdout);
  pg.broadcast(ok, 0).wait();
  return ok.data_as<std::int32_t>()[0] == 1 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto p = parse(argc, argv);
    if (troupe::launched_by_launcher()) return run_launched(p);
    check_cells(p);
    std::printf("heat_simulation: %d cells on %d ranks, tol %.1e\n", p.cells, p.ranks, p.tol);
    if (p.kill_rank >= 0) return run_threads_recovering(p);
    solution parallel;
    troupe::testing::run_ranks(p.ranks, [&](troupe::world& w) {
      auto [g, s] = run_recovering(w, p);
      if ((g ? g->rank() : w.rank()) == 0) parallel = std::move(s);
    });
    return matches_serial(p, parallel) ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "heat_simulation FAILED: %s\n", e.what());
    return 1;
  }
}
