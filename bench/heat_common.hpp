#pragma once
// heat_common — the step of examples/heat_simulation.cpp as a benchmark,
// shared by troupe's program (heat_bench.cpp) and OpenMPI's twin
// (heat_mpi.cpp): the 1-D heat equation u_t = u_xx on a rod held at 1 on the
// left and 0 on the right, `cells` cells per rank. One step: swap the edge
// cells with both neighbours (a halo of one float64 each way), update the
// own cells by explicit Euler, and every `check_every` steps an allreduce MAX
// of the local change (the example's convergence test).
//
// Both programs run `warmup` steps, then `rounds` rounds of `steps` steps,
// each round between barriers and timed; a round's time per step is the
// slowest rank's. The record (bench_common's CSV, op "heat", bytes = one
// rank's cells x 8) holds the median over rounds. At the end rank 0 gathers
// the rod and compares it with a serial solve of as many steps: the cells
// must be equal bit for bit (the same arithmetic in the same order), and the
// last allreduced change must equal the serial one.
//
//   heat_bench --inprocess N | troupe-run -n N heat_bench | mpirun -n N heat_mpi
//       [--cells C (1024)] [--steps S (100)] [--rounds R (20; --quick: 10)]
//       [--warmup W (100)] [--csv F] [--transport LABEL] [--quick]

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace heat {

struct params {
  int cells = 1024;  ///< per rank
  int steps = 100;   ///< per timed round
  int rounds = 20;
  int warmup = 100;  ///< steps before the first round
  int check_every = 10;
  double k = 0.4;  ///< dt / dx^2, as the example
  int ranks = 0;   ///< --inprocess N (troupe only)
  std::string csv, transport;

  int total_steps() const { return warmup + rounds * steps; }
};

/// Parses the options above; `inprocess` says whether --inprocess N is allowed.
inline params parse(int argc, char** argv, bool inprocess) {
  params p;
  bool rounds_given = false, quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(a + " expects a value");
    const std::string v = argv[++i];
    auto number = [&](int least) {
      std::size_t used = 0;
      int x = -1;
      try {
        x = std::stoi(v, &used);
      } catch (const std::exception&) {
      }
      if (used != v.size() || x < least)
        throw std::invalid_argument(a + " expects an integer >= " + std::to_string(least) +
                                    ", got '" + v + "'");
      return x;
    };
    if (a == "--cells")
      p.cells = number(1);
    else if (a == "--steps")
      p.steps = number(1);
    else if (a == "--rounds") {
      p.rounds = number(1);
      rounds_given = true;
    } else if (a == "--warmup")
      p.warmup = number(0);
    else if (a == "--csv")
      p.csv = v;
    else if (a == "--transport")
      p.transport = v;
    else if (a == "--inprocess" && inprocess)
      p.ranks = number(1);
    else
      throw std::invalid_argument("unknown argument '" + a + "'");
  }
  if (quick && !rounds_given) p.rounds = 10;
  return p;
}

/// One explicit Euler step of a cell from its neighbours (the example's).
inline double update(double left, double mid, double right, double k) {
  return mid + k * (left - 2.0 * mid + right);
}

/// Updates cells 1..m of u (u[0] and u[m+1]: the neighbours' edge cells or
/// the rod's ends) through `next`; returns the largest change.
inline double step_cells(double* u, std::vector<double>& next, int m, double k) {
  double change = 0;
  for (int i = 1; i <= m; ++i) {
    next[i] = update(u[i - 1], u[i], u[i + 1], k);
    change = std::max(change, std::fabs(next[i] - u[i]));
  }
  std::copy(next.begin() + 1, next.begin() + 1 + m, u + 1);
  return change;
}

/// The serial reference after `p.total_steps()` steps of a rod of `n` x
/// cells: the interior cells and the largest change at the last check step.
struct reference {
  std::vector<double> u;
  double change = 0;
};
inline reference solve_serial(const params& p, int n) {
  const int m = p.cells * n;
  std::vector<double> u(static_cast<std::size_t>(m) + 2, 0.0), next = u;
  u[0] = 1.0;
  reference r;
  for (int step = 1; step <= p.total_steps(); ++step) {
    const double change = step_cells(u.data(), next, m, p.k);
    if (step % p.check_every == 0) r.change = change;
  }
  r.u.assign(u.begin() + 1, u.end() - 1);
  return r;
}

/// Rank 0: the gathered rod and last allreduced change against the serial
/// solve; "" when equal, else what differs.
inline std::string compare(const params& p, int n, const std::vector<double>& rod, double change) {
  const reference s = solve_serial(p, n);
  for (std::size_t i = 0; i < s.u.size(); ++i)
    if (rod[i] != s.u[i]) {
      char b[160];
      std::snprintf(b, sizeof b, "cell %zu is %.17g after %d steps, the serial solve has %.17g", i,
                    rod[i], p.total_steps(), s.u[i]);
      return b;
    }
  if (change != s.change) {
    char b[160];
    std::snprintf(b, sizeof b, "last allreduced change %.17g, the serial solve has %.17g", change,
                  s.change);
    return b;
  }
  return "";
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

/// The record of one run: `per_step_us` holds every round's time per step
/// (already the slowest rank's).
inline bench::record make_record(const std::string& system, const std::string& transport, int n,
                                 const params& p, const std::vector<double>& per_step_us) {
  return {system,   transport,           n, "heat", std::size_t(p.cells) * sizeof(double),
          p.rounds, median(per_step_us), 0, 0};
}

/// Rank 0's report line (and the CSV row when --csv).
inline void report(const bench::record& r, const params& p) {
  std::printf(
      "%s/%s, %d ranks: heat step (%d cells per rank, %d rounds of %d steps after %d): "
      "%.2f us per step (median round, slowest rank); rod equals the serial solve\n",
      r.system.c_str(), r.transport.c_str(), r.ranks, p.cells, p.rounds, p.steps, p.warmup,
      r.median_us);
  std::fflush(stdout);
  if (!p.csv.empty()) bench::append_csv(p.csv, {r});
}

}  // namespace heat
