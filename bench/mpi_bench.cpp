// mpi_bench_worker — OpenMPI's side of the collectives benchmark (Debian
// libopenmpi-dev): the same collectives, sizes, checks and timing as
// troupe_bench_worker (bench_common.cpp drives them), with MPI_Allreduce
// (MPI_IN_PLACE), MPI_Bcast, MPI_Allgather, MPI_Reduce_scatter_block and
// MPI_Alltoall; with --ops (all) MPI_Reduce (MPI_IN_PLACE on the root),
// MPI_Gather, MPI_Scatter (root 0), MPI_Barrier, pingpong (MPI_Send then
// MPI_Recv on rank 0, MPI_Recv then MPI_Send on rank n / 2) and halo
// (MPI_Isend and MPI_Irecv to both ring neighbours, MPI_Waitall).
//
//   mpirun -n N [--mca btl self,vader | --mca btl self,tcp --mca btl_tcp_if_include lo]
//          mpi_bench_worker --transport shm|tcp [--csv F] [--quick] [--check-only] [--iters K]
//                           [--ops allreduce,broadcast,...|all] [--rss]
//
// --transport only labels the records; mpirun's options choose the path
// (bench/run_bench.sh passes both).

#include <mpi.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace {

/// Tags of the point-to-point ops, as troupe_bench_worker's.
constexpr int tag_pingpong = 1, tag_rightward = 2, tag_leftward = 3;

bench::prepared_op prepare(int me, int n, bench::op_kind op, const bench::layout& l) {
  using bench::op_kind;
  auto in = bench::alloc_floats(l.in_elems);
  auto out = in;  // in place unless the op has its own output
  float* i = in.get();
  const int in_n = static_cast<int>(l.in_elems);
  const int block = static_cast<int>(l.block);
  std::function<void()> run;
  switch (op) {
    case op_kind::allreduce:
      run = [i, in_n] { MPI_Allreduce(MPI_IN_PLACE, i, in_n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
      break;
    case op_kind::broadcast:
      run = [i, in_n] { MPI_Bcast(i, in_n, MPI_FLOAT, 0, MPI_COMM_WORLD); };
      break;
    case op_kind::allgather:
      out = bench::alloc_floats(l.out_elems);
      run = [i, o = out.get(), block] {
        MPI_Allgather(i, block, MPI_FLOAT, o, block, MPI_FLOAT, MPI_COMM_WORLD);
      };
      break;
    case op_kind::reduce_scatter:
      out = bench::alloc_floats(l.out_elems);
      run = [i, o = out.get(), block] {
        MPI_Reduce_scatter_block(i, o, block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      };
      break;
    case op_kind::alltoall:
      out = bench::alloc_floats(l.out_elems);
      run = [i, o = out.get(), block] {
        MPI_Alltoall(i, block, MPI_FLOAT, o, block, MPI_FLOAT, MPI_COMM_WORLD);
      };
      break;
    case op_kind::reduce:
      run = [i, in_n, me] {
        MPI_Reduce(me == 0 ? MPI_IN_PLACE : i, i, in_n, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
      };
      break;
    case op_kind::gather:
      out = bench::alloc_floats(l.out_elems);
      run = [i, o = out.get(), block] {
        MPI_Gather(i, block, MPI_FLOAT, o, block, MPI_FLOAT, 0, MPI_COMM_WORLD);
      };
      break;
    case op_kind::scatter:
      out = bench::alloc_floats(l.out_elems);
      run = [i, o = out.get(), block] {
        MPI_Scatter(i, block, MPI_FLOAT, o, block, MPI_FLOAT, 0, MPI_COMM_WORLD);
      };
      break;
    case op_kind::barrier:
      run = [] { MPI_Barrier(MPI_COMM_WORLD); };
      break;
    case op_kind::pingpong:
      out = bench::alloc_floats(l.out_elems);
      if (me == 0)
        run = [i, o = out.get(), in_n, partner = bench::pingpong_partner(n)] {
          MPI_Send(i, in_n, MPI_FLOAT, partner, tag_pingpong, MPI_COMM_WORLD);
          MPI_Recv(o, in_n, MPI_FLOAT, partner, tag_pingpong, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        };
      else if (me != bench::pingpong_partner(n))
        run = [] {};  // waits (the barrier before each iteration)
      else
        run = [o = out.get(), in_n] {
          MPI_Recv(o, in_n, MPI_FLOAT, 0, tag_pingpong, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          MPI_Send(o, in_n, MPI_FLOAT, 0, tag_pingpong, MPI_COMM_WORLD);
        };
      break;
    case op_kind::halo:
      out = bench::alloc_floats(l.out_elems);
      run = [i, o = out.get(), in_n, left = (me + n - 1) % n, right = (me + 1) % n] {
        MPI_Request req[4];
        MPI_Isend(i, in_n, MPI_FLOAT, left, tag_leftward, MPI_COMM_WORLD, &req[0]);
        MPI_Isend(i, in_n, MPI_FLOAT, right, tag_rightward, MPI_COMM_WORLD, &req[1]);
        MPI_Irecv(o, in_n, MPI_FLOAT, left, tag_rightward, MPI_COMM_WORLD, &req[2]);
        MPI_Irecv(o + in_n, in_n, MPI_FLOAT, right, tag_leftward, MPI_COMM_WORLD, &req[3]);
        MPI_Waitall(4, req, MPI_STATUSES_IGNORE);
      };
      break;
  }
  auto keep = std::make_shared<std::vector<std::shared_ptr<float>>>(
      std::vector<std::shared_ptr<float>>{in, out});
  return {i, out.get(), std::move(run), keep};
}

int run(const bench::worker_args& a) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string transport = a.transport.empty() ? "shm" : a.transport;

  bench::rank_runtime rt;
  rt.rank = rank;
  rt.size = size;
  rt.barrier = [] { MPI_Barrier(MPI_COMM_WORLD); };
  rt.max_all = [](std::vector<double>& v) {
    MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_MAX,
                  MPI_COMM_WORLD);
  };
  rt.prepare = [rank, size](bench::op_kind op, const bench::layout& l) {
    return prepare(rank, size, op, l);
  };

  const bench::run_config c = bench::config_of(a, "mpi", transport);
  if (a.memcpy) throw std::invalid_argument("--memcpy is troupe_bench_worker's");
  if (a.rss) {
    bench::report_rss(rt, c, a.csv);
    return 0;
  }
  auto rows = bench::run_rank(rt, c);
  if (rank != 0) return 0;
  if (a.check_only) {
    std::printf("mpi/%s, %d ranks: every collective and size correct\n", transport.c_str(), size);
  } else {
    bench::print_records(rows);
    if (!a.csv.empty()) bench::append_csv(a.csv, rows);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 0;
  try {
    code = run(bench::parse_worker_args(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_bench_worker: %s\n", e.what());
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return code;
}
