// heat_mpi — OpenMPI's twin of heat_bench (see heat_common.hpp): the same
// step, every step MPI_Isend and MPI_Irecv of the edge cells with both
// neighbours and MPI_Waitall, the update, and every 10 steps an
// MPI_Allreduce MAX of the local change; at the end the rod is gathered
// (MPI_Gather) and compared with the serial solve.
//
//   mpirun -n N [--mca btl self,vader | ...] heat_mpi --transport shm|tcp
//          [--cells C] [--steps S] [--rounds R] [--warmup W] [--csv F] [--quick]

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "heat_common.hpp"

namespace {

void run(const heat::params& p) {
  int r = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const std::string transport = p.transport.empty() ? "shm" : p.transport;
  const int m = p.cells;
  std::vector<double> field(static_cast<std::size_t>(m) + 2, 0.0), next(field.size());
  double* u = field.data();
  if (r == 0) u[0] = 1.0;
  double global_change = 0;

  auto step = [&](int s) {
    MPI_Request req[4];
    int k = 0;
    if (r > 0) {
      MPI_Isend(u + 1, 1, MPI_DOUBLE, r - 1, 0, MPI_COMM_WORLD, &req[k++]);
      MPI_Irecv(u, 1, MPI_DOUBLE, r - 1, 0, MPI_COMM_WORLD, &req[k++]);
    }
    if (r < n - 1) {
      MPI_Isend(u + m, 1, MPI_DOUBLE, r + 1, 0, MPI_COMM_WORLD, &req[k++]);
      MPI_Irecv(u + m + 1, 1, MPI_DOUBLE, r + 1, 0, MPI_COMM_WORLD, &req[k++]);
    }
    MPI_Waitall(k, req, MPI_STATUSES_IGNORE);
    double local_change = heat::step_cells(u, next, m, p.k);
    if (s % p.check_every == 0) {
      MPI_Allreduce(&local_change, &global_change, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
  };

  using clock = std::chrono::steady_clock;
  int s = 0;
  while (s < p.warmup) step(++s);
  std::vector<double> per_step(p.rounds);
  for (int round = 0; round < p.rounds; ++round) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = clock::now();
    for (int i = 0; i < p.steps; ++i) step(++s);
    const auto t1 = clock::now();
    per_step[round] = std::chrono::duration<double, std::micro>(t1 - t0).count() / p.steps;
  }
  MPI_Allreduce(MPI_IN_PLACE, per_step.data(), p.rounds, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

  std::vector<double> rod(r == 0 ? static_cast<std::size_t>(m) * n : 0);
  MPI_Gather(u + 1, m, MPI_DOUBLE, rod.data(), m, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  int wrong = 0;
  std::string what;
  if (r == 0) {
    what = heat::compare(p, n, rod, global_change);
    wrong = what.empty() ? 0 : 1;
  }
  MPI_Bcast(&wrong, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (wrong)
    throw std::runtime_error("mpi/" + transport + " heat with " + std::to_string(n) +
                             " ranks: the rod differs from the serial solve" +
                             (what.empty() ? "" : ": " + what));
  if (r == 0) heat::report(heat::make_record("mpi", transport, n, p, per_step), p);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  try {
    run(heat::parse(argc, argv, false));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "heat_mpi: %s\n", e.what());
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return 0;
}
