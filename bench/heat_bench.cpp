// heat_bench — the step of examples/heat_simulation.cpp timed on troupe (see
// heat_common.hpp for the protocol; heat_mpi is OpenMPI's twin): every step
// a batch_isend_irecv of the edge cells with both neighbours, the update, and
// every 10 steps an allreduce MAX of the local change; at the end the rod is
// gathered (gatherv) and compared with the serial solve.
//
//   heat_bench --inprocess N [--cells C] [--steps S] [--rounds R] [--warmup W]
//              [--csv F] [--quick]
//       N ranks on threads of this process (records say transport inproc)
//   TROUPE_TRANSPORT=shm|tcp troupe-run -n N heat_bench [...]
//       one rank per process; records say the transport
//
// Every call carries a timeout (op_timeout): a rank that stops answering
// fails the run (message, exit 1) instead of hanging it.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "heat_common.hpp"
#include "troupe/launch.hpp"
#include "troupe/testing.hpp"
#include "troupe/troupe.hpp"

namespace {

using troupe::p2p_op;
using troupe::tensor;

constexpr std::chrono::milliseconds op_timeout = std::chrono::seconds(60);

/// One rank: warm-up, timed rounds, then the check on rank 0 and the verdict
/// on every rank (throws when the rod differs from the serial solve).
void run_rank(troupe::world& w, const heat::params& p, const std::string& transport) {
  auto& pg = w.default_group();
  const int r = pg.rank(), n = pg.size();
  const int m = p.cells;
  // Local cells 1..m plus one ghost cell on each side (the neighbours' edge cells).
  auto field = tensor::zeros({m + 2}, troupe::dtype::float64);
  double* u = field.data_as<double>();
  if (r == 0) u[0] = 1.0;  // the hot end of the rod
  std::vector<double> next(static_cast<std::size_t>(m) + 2);
  auto change = tensor::zeros({1}, troupe::dtype::float64);
  double global_change = 0;

  // The example's step, as written there.
  auto step = [&](int s) {
    std::vector<p2p_op> halo;
    if (r > 0) {
      halo.push_back({p2p_op::isend, field.flat_slice(1, 1), r - 1});
      halo.push_back({p2p_op::irecv, field.flat_slice(0, 1), r - 1});
    }
    if (r < n - 1) {
      halo.push_back({p2p_op::isend, field.flat_slice(m, 1), r + 1});
      halo.push_back({p2p_op::irecv, field.flat_slice(m + 1, 1), r + 1});
    }
    if (!halo.empty()) pg.batch_isend_irecv(halo).wait(op_timeout);
    const double local_change = heat::step_cells(u, next, m, p.k);
    if (s % p.check_every == 0) {
      change.data_as<double>()[0] = local_change;
      pg.allreduce(change, {.op = troupe::reduce_op::MAX, .timeout = op_timeout}).wait();
      global_change = change.data_as<double>()[0];
    }
  };
  auto barrier = [&] { pg.barrier({.timeout = op_timeout}).wait(); };

  using clock = std::chrono::steady_clock;
  int s = 0;
  while (s < p.warmup) step(++s);
  std::vector<double> per_step(p.rounds);
  for (int round = 0; round < p.rounds; ++round) {
    barrier();
    const auto t0 = clock::now();
    for (int i = 0; i < p.steps; ++i) step(++s);
    const auto t1 = clock::now();
    per_step[round] = std::chrono::duration<double, std::micro>(t1 - t0).count() / p.steps;
  }
  // A round takes as long as its slowest rank.
  auto t = tensor::from_blob(per_step.data(), {p.rounds}, troupe::dtype::float64);
  pg.allreduce(t, {.op = troupe::reduce_op::MAX, .timeout = op_timeout}).wait();

  // The rod on rank 0, checked against the serial solve; every rank learns the verdict.
  auto rod = r == 0 ? tensor::zeros({std::int64_t(m) * n}, troupe::dtype::float64) : tensor{};
  pg.gatherv(rod, field.flat_slice(1, m), std::vector<std::int64_t>(n, m),
             {.root_rank = 0, .timeout = op_timeout})
      .wait();
  auto verdict = tensor::zeros({1}, troupe::dtype::float64);
  std::string wrong;
  if (r == 0) {
    wrong = heat::compare(p, n, rod.to_vector<double>(), global_change);
    verdict.data_as<double>()[0] = wrong.empty() ? 0 : 1;
  }
  pg.broadcast(verdict, {.root_rank = 0, .timeout = op_timeout}).wait();
  if (verdict.data_as<double>()[0] != 0)
    throw std::runtime_error("troupe/" + transport + " heat with " + std::to_string(n) +
                             " ranks: the rod differs from the serial solve" +
                             (wrong.empty() ? "" : ": " + wrong));
  if (r == 0) heat::report(heat::make_record("troupe", transport, n, p, per_step), p);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto p = heat::parse(argc, argv, true);
    if (troupe::launched_by_launcher()) {
      if (p.ranks) throw std::invalid_argument("--inprocess cannot be used under a launcher");
      const char* t = std::getenv("TROUPE_TRANSPORT");
      troupe::init_options o;
      o.timeout = std::chrono::minutes(2);
      auto w = troupe::init_world(o);
      run_rank(*w, p, p.transport.empty() ? (t && *t ? t : "auto") : p.transport);
      return 0;
    }
    if (p.ranks < 1)
      throw std::invalid_argument("give --inprocess N, or start under troupe-run -n N");
    troupe::testing::run_options o;
    o.timeout = std::chrono::minutes(2);
    troupe::testing::run_ranks(
        p.ranks,
        [&](troupe::world& w) { run_rank(w, p, p.transport.empty() ? "inproc" : p.transport); }, o);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "heat_bench: %s\n", e.what());
    return 1;
  }
}
