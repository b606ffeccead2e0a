// troupe_bench_worker — troupe's side of the collectives benchmark
// (bench/run_bench.sh runs it next to Gloo and OpenMPI): allreduce,
// broadcast, allgather_into_tensor, reduce_scatter_tensor and alltoall_single
// on float32, and with --ops (all) reduce, gather and scatter (root 0),
// barrier, pingpong (pg.send then pg.recv on rank 0, recv then send on rank
// n / 2, as a user writes them; the others wait) and halo (batch_isend_irecv of an isend and an
// irecv to each ring neighbour); each checked once against a local
// expectation, then timed (bench_common.cpp drives the protocol). The calls
// added with those ops carry a timeout of their own (op_timeout): a peer that
// never answers fails the run instead of hanging it.
//
//   troupe_bench_worker --inprocess N [--csv F] [--quick] [--check-only] [--iters K]
//                       [--ops allreduce,broadcast,...|all] [--sizes 4B,1MiB] [--rss]
//                       [--min-time MS]
//       N ranks on threads of this process (one world each, one hash_store)
//   TROUPE_TRANSPORT=shm|tcp troupe-run -n N troupe_bench_worker [--csv F] ...
//   TROUPE_TRANSPORT=shm troupe-run -n N troupe_bench_worker --transport shmstaged ...
//     (buffers kept private, TROUPE_SHARE_IN_PLACE=off: every allreduce stages)
//       one rank per process (troupe::init_world); records say the transport
//   troupe_bench_worker --memcpy [--csv F] [--quick] [--iters K]
//       single-thread memcpy at the same sizes (the bandwidth reference)
//
// --ops picks collectives (default: the five; all: every op). --min-time MS
// times each size for at least MS ms (default 100), warmed up for half as
// long (bench_common.cpp: where ranks share CPUs the default window is too
// short). --rss measures peak resident memory during a 64 MiB allreduce
// instead (bench_common's run_rss; --csv then names the RSS CSV). Rank 0
// prints the records and appends them to the CSV file.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "troupe/launch.hpp"
#include "troupe/testing.hpp"
#include "troupe/troupe.hpp"

namespace {

using troupe::p2p_op;
using troupe::p2p_options;
using troupe::process_group;
using troupe::tensor;

/// The bound of every call of the added ops: far above a 64 MiB transfer, far
/// below run_bench.sh's limit per run.
constexpr std::chrono::milliseconds op_timeout = std::chrono::seconds(60);

/// Tags of the point-to-point ops: halo tells the direction (a message to
/// the right neighbour arrives as "from the left"), so that with 2 ranks,
/// where both neighbours are the same peer, each block lands in its half.
constexpr int tag_pingpong = 1, tag_rightward = 2, tag_leftward = 3;

/// `count` consecutive views of `block` elements of t.
troupe::tensor_list blocks(const tensor& t, std::size_t block, int count) {
  troupe::tensor_list v;
  for (int r = 0; r < count; ++r)
    v.push_back(
        t.flat_slice(static_cast<std::int64_t>(r * block), static_cast<std::int64_t>(block)));
  return v;
}

tensor floats(std::size_t elems) {
  return tensor::empty({static_cast<std::int64_t>(elems)}, troupe::dtype::float32);
}

/// Buffers (troupe's own allocation) and the call for one collective.
bench::prepared_op prepare(process_group& pg, bench::op_kind op, const bench::layout& l) {
  using bench::op_kind;
  const int me = pg.rank(), n = pg.size();
  auto in = floats(l.in_elems);
  tensor out = in;  // in place unless the op has its own output
  std::function<void()> run;
  switch (op) {
    case op_kind::allreduce:
      run = [&pg, in] { pg.allreduce(in).wait(); };
      break;
    case op_kind::broadcast:
      run = [&pg, in] { pg.broadcast(in, 0).wait(); };
      break;
    case op_kind::allgather:
      out = floats(l.out_elems);
      run = [&pg, in, out] { pg.allgather_into_tensor(out, in).wait(); };
      break;
    case op_kind::reduce_scatter:
      out = floats(l.out_elems);
      run = [&pg, in, out] { pg.reduce_scatter_tensor(out, in).wait(); };
      break;
    case op_kind::alltoall:
      out = floats(l.out_elems);
      run = [&pg, in, out] { pg.alltoall_single(out, in).wait(); };
      break;
    case op_kind::reduce:
      run = [&pg, in] { pg.reduce(in, {.root_rank = 0, .timeout = op_timeout}).wait(); };
      break;
    case op_kind::gather: {
      // The root receives into n views of one output tensor; the others pass none.
      out = floats(l.out_elems);
      auto outs = me == 0 ? blocks(out, l.block, n) : troupe::tensor_list{};
      run = [&pg, in, outs] {
        pg.gather(outs, in, {.root_rank = 0, .timeout = op_timeout}).wait();
      };
      break;
    }
    case op_kind::scatter: {
      out = floats(l.out_elems);
      auto ins = me == 0 ? blocks(in, l.block, n) : troupe::tensor_list{};
      run = [&pg, ins, out] {
        pg.scatter(out, ins, {.root_rank = 0, .timeout = op_timeout}).wait();
      };
      break;
    }
    case op_kind::barrier:
      run = [&pg] { pg.barrier({.timeout = op_timeout}).wait(); };
      break;
    case op_kind::pingpong: {
      // Rank 0 sends `in` and receives the echo into `out`; its partner
      // receives into `out` and sends it back; the others wait. The time of
      // one call is a round trip.
      out = floats(l.out_elems);
      const p2p_options o{.tag = tag_pingpong, .timeout = op_timeout};
      const int partner = bench::pingpong_partner(n);
      if (me == 0)
        run = [&pg, in, out, o, partner] {
          pg.send({in}, partner, o).wait();
          pg.recv({out}, partner, o).wait();
        };
      else if (me != partner)
        run = [] {};
      else
        run = [&pg, out, o] {
          pg.recv({out}, 0, o).wait();
          pg.send({out}, 0, o).wait();
        };
      break;
    }
    case op_kind::halo: {
      // My block to both ring neighbours; theirs into the two halves of `out`.
      out = floats(l.out_elems);
      const int left = (me + n - 1) % n, right = (me + 1) % n;
      const auto halves = blocks(out, l.block, 2);
      std::vector<p2p_op> ops = {{p2p_op::isend, in, left, tag_leftward},
                                 {p2p_op::isend, in, right, tag_rightward},
                                 {p2p_op::irecv, halves[0], left, tag_rightward},
                                 {p2p_op::irecv, halves[1], right, tag_leftward}};
      run = [&pg, ops] { pg.batch_isend_irecv(ops).wait(op_timeout); };
      break;
    }
  }
  auto keep = std::make_shared<std::vector<tensor>>(std::vector<tensor>{in, out});
  return {in.data_as<float>(), out.data_as<float>(), std::move(run), keep};
}

bench::rank_runtime runtime_of(troupe::world& w) {
  auto& pg = w.default_group();
  bench::rank_runtime rt;
  rt.rank = w.rank();
  rt.size = w.size();
  rt.barrier = [&pg] { pg.barrier().wait(); };
  rt.max_all = [&pg](std::vector<double>& v) {
    auto t =
        tensor::from_blob(v.data(), {static_cast<std::int64_t>(v.size())}, troupe::dtype::float64);
    pg.allreduce(t, troupe::reduce_op::MAX).wait();
  };
  rt.prepare = [&pg](bench::op_kind op, const bench::layout& l) { return prepare(pg, op, l); };
  return rt;
}

/// One rank: run everything, and on rank 0 report.
void run_world(troupe::world& w, const bench::worker_args& a, const std::string& transport) {
  // Large tensors stay private: allreduces stage through the segment, as
  // for borrowed memory (the default moves them into shared memory).
  if (transport == "shmstaged") ::setenv("TROUPE_SHARE_IN_PLACE", "off", 1);
  const bench::run_config c = bench::config_of(a, "troupe", transport);
  if (a.rss) {
    bench::report_rss(runtime_of(w), c, a.csv);
    return;
  }
  // What the ranks choose their algorithms by (measured at start where
  // TROUPE_LINK_COSTS=measure; hosts_bench.sh --measure-at-start reads it).
  if (w.rank() == 0) std::fprintf(stderr, "troupe link costs: %s\n", w.link_costs().c_str());
  auto rows = bench::run_rank(runtime_of(w), c);
  if (w.rank() != 0) return;
  if (a.check_only) {
    std::printf("troupe/%s, %d ranks: every collective and size correct\n", transport.c_str(),
                w.size());
    std::fflush(stdout);
    return;
  }
  bench::print_records(rows);
  if (!a.csv.empty()) bench::append_csv(a.csv, rows);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto a = bench::parse_worker_args(argc, argv);
    if (a.memcpy) {
      if (a.ranks || a.rss || troupe::launched_by_launcher())
        throw std::invalid_argument("--memcpy runs alone (no --inprocess, --rss or launcher)");
      const auto rows = bench::run_memcpy(a.quick, a.iters);
      bench::print_records(rows);
      if (!a.csv.empty()) bench::append_csv(a.csv, rows);
      return 0;
    }
    if (troupe::launched_by_launcher()) {
      if (a.ranks) throw std::invalid_argument("--inprocess cannot be used under a launcher");
      const char* t = std::getenv("TROUPE_TRANSPORT");
      troupe::init_options o;
      o.timeout = std::chrono::minutes(5);
      auto w = troupe::init_world(o);
      run_world(*w, a, a.transport.empty() ? (t && *t ? t : "auto") : a.transport);
      return 0;
    }
    if (a.ranks < 1)
      throw std::invalid_argument("give --inprocess N, or start under troupe-run -n N");
    troupe::testing::run_options o;
    o.timeout = std::chrono::minutes(5);
    troupe::testing::run_ranks(
        a.ranks, [&](troupe::world& w) { run_world(w, a, "inproc"); }, o);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe_bench_worker: %s\n", e.what());
    return 1;
  }
}
