// bench_report — the collectives benchmark's report: reads the CSV that the
// workers wrote (bench/out/results.csv), prints one table per collective (and
// per point-to-point op: pingpong, halo), the heat step's table, and writes
// the data and the gnuplot script of the bus bandwidth plots.
//
//   bench_report results.csv [--plots DIR] [--rss rss.csv] [--cpus K]
//
// Per collective, one row per (ranks, size): the median time of every system
// in µs (the lower one where the CSV holds several rounds), the ratios of
// times (troupe / peer: below 1 troupe is faster) and the bus bandwidth of
// every system. The memcpy rows of the CSV (system memcpy) give a small table
// of their own and the ratio of troupe's allreduce busbw to memcpy's
// bandwidth; --rss adds the peak resident memory per rank during a
// 64 MiB allreduce; heat_bench's and heat_mpi's rows (op heat) give the time
// per step of the heat simulation. The report ends with the performance
// targets (report_targets.cpp; those of an op the CSV has no row of are
// counted, not listed): each one's measured value, the goal and met /
// missed / not measured, and where the
// run measured what the machine allows, that limit: the raw TCP exchange of
// tcp_exchange (rows tcp-ceiling: 2 processes exchanging, or with more ranks
// the bytes of a ring allreduce moved round a ring of processes, nothing
// reduced) for the TCP busbw targets, a bound from
// memcpy's time for the shared-memory targets from 1 MiB (ranks x memcpy time
// / min(ranks, K CPUs), K = --cpus, default the CPUs this process may run
// on), and for the small collectives the fastest barrier of their processes
// (any system's, or flag_barrier's rows flag-barrier: troupe completes no
// collective before every rank heard what every other rank called, so none
// is faster than a barrier of its ranks);
// a missed target whose goal lies beyond that limit is out of reach
// rather than missed. With --plots, DIR
// gets busbw_<op>_<n>ranks.dat and plots.gp (`gnuplot plots.gp` in DIR draws
// busbw_<op>_<n>ranks.png; allreduce's plots have memcpy as a reference line).

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "report_common.hpp"

using namespace report;

namespace {

void print_header(const char* ratios) {
  std::printf("%2s %8s |", "n", "size");
  for (auto& c : columns) std::printf(" %13s", c.second.c_str());
  std::printf("%s\n", ratios);
}

/// One table per collective: times and time ratios, then bus bandwidth, one
/// row per (ranks, size) in both halves.
void print_table(const std::string& op, const cell_map& cells) {
  const char* what = op == "pingpong" ? "one-way time (us) = round trip / 2"
                     : op == "halo"   ? "time per exchange (us)"
                                      : "time per op (us)";
  std::printf("\n### %s (float32): %s, time ratios troupe / peer\n\n", op.c_str(), what);
  print_header(" | best/gloo  tcp/gloo   shm/mpi   tcp/mpi");
  for (const auto& [k, row] : cells) {
    if (std::get<0>(k) != op) continue;
    std::printf("%2d %8s |", std::get<1>(k), bench::size_label(std::get<2>(k)).c_str());
    for (auto& c : columns) std::printf(" %13s", fmt("%.1f", time_of(row, c.first)).c_str());
    // Time ratios: troupe's time over the peer's (below 1: troupe is faster).
    const double best =
        std::fmin(time_of(row, "troupe-inproc"),
                  std::fmin(time_of(row, "troupe-shm"), time_of(row, "troupe-tcp")));
    std::printf(" | %9s %9s %9s %9s\n", fmt("%.2f", best / time_of(row, "gloo-tcp")).c_str(),
                fmt("%.2f", time_of(row, "troupe-tcp") / time_of(row, "gloo-tcp")).c_str(),
                fmt("%.2f", time_of(row, "troupe-shm") / time_of(row, "mpi-shm")).c_str(),
                fmt("%.2f", time_of(row, "troupe-tcp") / time_of(row, "mpi-tcp")).c_str());
  }
  if (op == "barrier") return;  // no data: no bandwidth
  std::printf("\n%s %s (GB/s):\n", op.c_str(),
              op == "pingpong" ? "one-way bandwidth (size / one-way time)"
              : op == "halo"   ? "bandwidth per rank (2 x size / time)"
                               : "bus bandwidth");
  print_header("");
  for (const auto& [k, row] : cells) {
    if (std::get<0>(k) != op) continue;
    std::printf("%2d %8s |", std::get<1>(k), bench::size_label(std::get<2>(k)).c_str());
    for (auto& c : columns) {
      const double bw = busbw_of(row, c.first);
      std::printf(" %13s", fmt(bw < 0.01 ? "%.2e" : "%.3f", bw).c_str());
    }
    std::printf("\n");
  }
}

/// heat_bench's and heat_mpi's rows: time per step of the heat simulation.
void print_heat(const cell_map& cells) {
  // The systems run_bench.sh measures; tcp ones only when the CSV has them.
  std::vector<std::pair<std::string, std::string>> heat_columns;
  for (const auto& c : columns) {
    const bool tcp = c.first == "troupe-tcp" || c.first == "mpi-tcp";
    const bool core = c.first == "troupe-inproc" || c.first == "troupe-shm" || c.first == "mpi-shm";
    if (core || (tcp && std::any_of(cells.begin(), cells.end(), [&](const auto& cell) {
                   return std::get<0>(cell.first) == "heat" && cell.second.count(c.first);
                 })))
      heat_columns.push_back(c);
  }
  const bool tcp = heat_columns.size() > 3;
  std::printf(
      "\n### heat simulation step (examples/heat_simulation.cpp, float64): time per step (us), "
      "time ratios troupe / peer\n\n%2s %10s |",
      "n", "cells/rank");
  for (auto& c : heat_columns) std::printf(" %13s", c.second.c_str());
  std::printf(" |   shm/mpi inproc/mpi%s\n", tcp ? "   tcp/mpi" : "");
  for (const auto& [k, row] : cells) {
    if (std::get<0>(k) != "heat") continue;
    std::printf("%2d %10zu |", std::get<1>(k), std::get<2>(k) / sizeof(double));
    for (auto& c : heat_columns) std::printf(" %13s", fmt("%.2f", time_of(row, c.first)).c_str());
    std::printf(" | %9s %10s",
                fmt("%.2f", time_of(row, "troupe-shm") / time_of(row, "mpi-shm")).c_str(),
                fmt("%.2f", time_of(row, "troupe-inproc") / time_of(row, "mpi-shm")).c_str());
    if (tcp)
      std::printf(" %9s",
                  fmt("%.2f", time_of(row, "troupe-tcp") / time_of(row, "mpi-tcp")).c_str());
    std::printf("\n");
  }
  std::printf(
      "heat: per step, a halo of one float64 with each neighbour (troupe batch_isend_irecv, mpi\n"
      "  Isend/Irecv/Waitall), the update of cells/rank cells, every 10th step an allreduce MAX\n"
      "  of the change; median over rounds of the slowest rank's time per step; the rod was\n"
      "  checked against a serial solve. inproc/mpi = troupe in one process / mpi shm.\n");
}

void print_legend() {
  std::printf(
      "\ntimes: µs per op = the slowest rank's time, median over the timed iterations (50 up\n"
      "to 1 MiB, 20 above; see results.csv) after warm-up; every result was checked against\n"
      "a local expectation before timing. A system measured in several rounds (run_bench.sh\n"
      "--repeat, default 2; every system in every round) shows its lower median.\n"
      "systems: troupe shm = one process per rank over shared memory, buffers from\n"
      "  tensor::empty (from 64 KiB, moved into shared memory in place on their second\n"
      "  allreduce: later ones read the peers' buffers); troupe staged = the same with\n"
      "  TROUPE_SHARE_IN_PLACE=off, allreduce only (every byte staged through the segment,\n"
      "  as for borrowed memory).\n"
      "size: the whole buffer as nccl-tests (allgather: output, reduce_scatter: input,\n"
      "alltoall: one rank's input; per-rank blocks of at least 1 element).\n"
      "ratios are TIME ratios, troupe / peer (below 1: troupe is faster):\n"
      "  best/gloo = fastest troupe mode (often in-process) / gloo, tcp/gloo = troupe tcp /\n"
      "  gloo (both TCP on loopback), shm/mpi = troupe shm / mpi shm, tcp/mpi = troupe tcp /\n"
      "  mpi tcp. busbw as nccl-tests: allreduce algbw*2(n-1)/n,\n"
      "  allgather, reduce_scatter, alltoall algbw*(n-1)/n, broadcast algbw.\n"
      "gloo's reduce_scatter is ReduceScatterHalvingDoubling (in place); mpi's is\n"
      "MPI_Reduce_scatter_block.\n"
      "reduce (SUM, in place), gather and scatter: root 0; size as allreduce, allgather and\n"
      "  reduce_scatter; results checked on the root (reduce, gather), on every rank (scatter).\n"
      "  busbw: reduce algbw, gather and scatter algbw*(n-1)/n. barrier: one row, 0 B.\n"
      "pingpong (2 ranks): rank 0 sends size bytes to rank 1, which sends them back (troupe\n"
      "  pg.send(...).wait() then pg.recv(...).wait(); mpi MPI_Send/MPI_Recv; gloo unbound\n"
      "  buffers); reported ONE-WAY: the round trip's median / 2; bandwidth = size / that.\n"
      "halo: every rank of a ring sends its block (size bytes) to both neighbours and receives\n"
      "  both of theirs (troupe batch_isend_irecv of 2 isend + 2 irecv; mpi Isend/Irecv/\n"
      "  Waitall; gloo unbound buffers); bandwidth per rank = 2 x size / time.\n"
      "memcpy: one thread copying between two touched buffers, timed as the collectives\n"
      "  (median; the same buffers every iteration, so small sizes copy within the caches);\n"
      "  its GB/s = bytes / time. allreduce busbw / memcpy GB/s compares troupe's allreduce\n"
      "  busbw (in one process, over shared memory) with that copy speed.\n"
      "peak RSS: each rank in a fresh process reads VmRSS (baseline), resets the high-water\n"
      "  mark, allocates and runs 3 checked allreduces of 64 MiB, reads VmHWM (peak); the\n"
      "  MAX over ranks. Shared-memory segments a rank touched count in its RSS.\n"
      "targets: troupe's performance goals, each with this run's value and met / MISSED /\n"
      "  not measured (the size, peer or rss.csv is missing from the run), and below a\n"
      "  target what the machine allows, measured in the same run:\n"
      "  ceiling (raw TCP exchange): 2 processes on loopback, one TCP connection, each\n"
      "    sending and receiving N bytes at once (no troupe, nothing reduced; the median\n"
      "    exchange, the slower process's time). A 2-rank allreduce of N bytes over TCP\n"
      "    moves at least N bytes out of and N into each process, so its busbw (= N / t\n"
      "    for 2 ranks) cannot exceed N / t_exchange.\n"
      "  ceiling (raw TCP ring; n ranks from 3): n processes in a ring on loopback, each\n"
      "    sending the 2(n-1)/n x N bytes of a ring allreduce to its right neighbour and\n"
      "    receiving as many from its left at once, in 1 MiB pieces: the first N/n sent\n"
      "    from its input and the rest from a window in the cache, the first half received\n"
      "    into a window and the second half into its N-byte output (nothing reduced; the\n"
      "    median pass, the slowest process's time); busbw = 2(n-1)/n x N / t. A ring\n"
      "    allreduce over TCP sends and receives those bytes and more work besides.\n"
      "  bound (memory bandwidth; troupe shm from 1 MiB): every rank reads its N input\n"
      "    bytes and writes N output bytes, about one memcpy of N (the memcpy row); n ranks\n"
      "    share the CPUs, so an allreduce takes at least n x memcpy time / min(n, CPUs).\n"
      "    Approximate: memcpy ran at another moment, and writing over what was just\n"
      "    read (in place) can move less than a memcpy.\n"
      "  bound (agreement; small collectives over shared memory): troupe completes no\n"
      "    collective before every rank knows what every other rank called, so each costs\n"
      "    at least a barrier of its ranks: the fastest of n processes in this run, of any\n"
      "    system or flag_barrier's (n processes, one shared counter line, the last arrival\n"
      "    starts a new generation the others poll, spinning or yielding: the faster;\n"
      "    timed as the collectives are: a barrier, then the timed one, the slowest rank,\n"
      "    the median).\n"
      "  A MISSED target whose goal lies beyond that limit shows as out of reach.\n");
}

/// memcpy's own table and, per size, troupe's allreduce busbw over memcpy's
/// bandwidth (in-process and shared memory, every rank count of the run).
void print_memcpy(const memcpy_map& memcpy, const cell_map& cells, const std::set<int>& ranks) {
  const bool ratios = std::any_of(cells.begin(), cells.end(), [](const auto& c) {
    return std::get<0>(c.first) == "allreduce";
  });
  std::printf("\n### memcpy (one thread, same sizes)%s\n\n%8s | %10s %9s",
              ratios ? "; troupe allreduce busbw / memcpy GB/s" : "", "size", "time us", "GB/s");
  const std::vector<std::pair<const char*, const char*>> modes = {{"troupe-inproc", "inproc"},
                                                                  {"troupe-shm", "shm"}};
  if (ratios) {
    std::printf(" |");
    for (const auto& m : modes)
      for (int n : ranks) {
        const std::string h = std::string(m.second) + " n=" + std::to_string(n);
        std::printf(" %11s", h.c_str());
      }
  }
  std::printf("\n");
  for (const auto& [bytes, m] : memcpy) {
    std::printf("%8s | %10.2f %9s", bench::size_label(bytes).c_str(), m.median_us,
                fmt(m.busbw < 0.01 ? "%.2e" : "%.3f", m.busbw).c_str());
    if (ratios) {
      std::printf(" |");
      for (const auto& mode : modes)
        for (int n : ranks) {
          auto r = find(cells, "allreduce", n, bytes, mode.first);
          std::printf(" %11s", fmt("%.3f", r ? r->busbw / m.busbw : NAN).c_str());
        }
    }
    std::printf("\n");
  }
}

void print_rss(const std::vector<bench::rss_record>& rss) {
  std::printf(
      "\n### peak resident memory per rank during an allreduce (float32, rss.csv)\n\n"
      "%-14s %2s %8s | %12s %9s %14s | %11s %16s\n",
      "system", "n", "tensor", "baseline MiB", "peak MiB", "peak-base MiB", "peak/tensor",
      "(peak-base)/tens");
  bool inproc = false;
  for (const auto& r : rss) {
    const double t = double(r.tensor_bytes), mib = double(MiB);
    const double base = per_rank(r, r.baseline_bytes), peak = per_rank(r, r.peak_bytes);
    const std::string sys = r.system + " " + r.transport + (r.transport == "inproc" ? "*" : "");
    inproc |= r.transport == "inproc";
    std::printf("%-14s %2d %8s | %12.1f %9.1f %14.1f | %11.2f %16.2f\n", sys.c_str(), r.ranks,
                bench::size_label(r.tensor_bytes).c_str(), base / mib, peak / mib,
                (peak - base) / mib, peak / t, (peak - base) / t);
  }
  if (inproc)
    std::printf(
        "* in-process: every rank is a thread of one process, so the process's values cover all\n"
        "  ranks together; shown divided by the ranks (a per-rank share).\n");
}

/// busbw_<op>_<n>ranks.dat (size, then one column per system, '?' = missing)
/// and one gnuplot script for all of them.
void write_plots(const std::string& dir, const cell_map& cells, const memcpy_map& memcpy,
                 const std::set<std::string>& ops, const std::set<int>& ranks) {
  std::ofstream gp(dir + "/plots.gp");
  gp << "# generated by bench_report: bus bandwidth against size, one line per system\n"
     << "set terminal pngcairo size 900,560 noenhanced\n"
     << "set datafile missing '?'\nset logscale xy\nset grid\nset key top left\n"
     << "set xlabel 'size (bytes, log)'\nset ylabel 'bus bandwidth (GB/s, log)'\n"
     << "set format y '%g'\nset xrange [2:1.4e8]\n"
     << "set xtics ('4 B' 4, '1 KiB' 1024, '64 KiB' 65536, '1 MiB' 1048576, "
        "'16 MiB' 16777216, '64 MiB' 67108864)\n";
  for (const auto& op : ops) {
    if (op == "barrier" || op == "heat") continue;  // one size, no bandwidth
    for (int n : ranks) {
      // Nothing to draw (pingpong with 4 ranks): no plot, gnuplot would stop.
      if (std::none_of(cells.begin(), cells.end(), [&](const auto& c) {
            return std::get<0>(c.first) == op && std::get<1>(c.first) == n;
          }))
        continue;
      const std::string base = "busbw_" + op + "_" + std::to_string(n) + "ranks";
      // allreduce's plots carry memcpy's bandwidth as a reference line.
      const bool with_memcpy = op == "allreduce" && !memcpy.empty();
      std::ofstream dat(dir + "/" + base + ".dat");
      dat << "# bytes";
      for (auto& c : columns) dat << ' ' << c.first;
      if (with_memcpy) dat << " memcpy";
      dat << '\n';
      auto put = [&dat](double bw) {
        if (std::isnan(bw) || bw <= 0)
          dat << " ?";
        else
          dat << ' ' << bw;
      };
      for (const auto& [k, row] : cells) {
        if (std::get<0>(k) != op || std::get<1>(k) != n) continue;
        dat << std::get<2>(k);
        for (auto& c : columns) put(busbw_of(row, c.first));
        if (with_memcpy) {
          auto m = memcpy.find(std::get<2>(k));
          put(m == memcpy.end() ? NAN : m->second.busbw);
        }
        dat << '\n';
      }
      gp << "set output '" << base << ".png'\n"
         << "set title '" << op << ", " << n << " ranks, float32 ("
         << (op == "pingpong" ? "one-way bandwidth"
             : op == "halo"   ? "2 x size / time per rank"
                              : "busbw as nccl-tests")
         << ")'\n"
         << "plot ";
      for (std::size_t i = 0; i < columns.size(); ++i)
        gp << (i ? ", \\\n     " : "") << "'" << base << ".dat' using 1:" << i + 2
           << " with linespoints lw 2 title '" << columns[i].second << "'";
      if (with_memcpy)
        gp << ", \\\n     '" << base << ".dat' using 1:" << columns.size() + 2
           << " with lines lw 1 dt 2 lc rgb 'black' title 'memcpy (1 thread)'";
      gp << "\n";
    }
  }
}

/// The CPUs this process may run on (the benchmark's ranks share them).
int cpus_available() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: bench_report results.csv [--plots DIR] [--rss rss.csv] [--cpus K]\n");
    return 2;
  }
  try {
    std::string plots, rss_csv;
    limits lim;
    lim.cpus = cpus_available();
    for (int i = 2; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--plots" && i + 1 < argc)
        plots = argv[++i];
      else if (a == "--rss" && i + 1 < argc)
        rss_csv = argv[++i];
      else if (a == "--cpus" && i + 1 < argc) {
        lim.cpus = std::atoi(argv[++i]);
        if (lim.cpus < 1) throw std::invalid_argument("--cpus expects a positive integer");
      } else
        throw std::invalid_argument("unknown argument '" + a + "'");
    }
    cell_map cells;
    memcpy_map memcpy;
    std::set<std::string> ops;
    std::set<int> ranks;
    // A cell measured more than once (run_bench.sh --repeat) keeps its lower median.
    auto keep_faster = [](auto& map, const auto& key, const bench::record& r) {
      auto [it, fresh] = map.try_emplace(key, r);
      if (!fresh && r.median_us < it->second.median_us) it->second = r;
    };
    for (auto& r : bench::read_csv(argv[1])) {
      if (r.system == "memcpy") {  // the reference rows: a table of their own
        keep_faster(memcpy, r.bytes, r);
        continue;
      }
      if (r.system == "tcp-ceiling") {  // the raw TCP exchange: in the targets only
        keep_faster(lim.tcp, ceiling_key{r.ranks, r.bytes}, r);
        continue;
      }
      if (r.system == "flag-barrier") {  // the least barrier: in the targets only
        keep_faster(lim.barrier, r.ranks, r);
        continue;
      }
      keep_faster(cells[{r.op, r.ranks, r.bytes}], r.system + "-" + r.transport, r);
      ops.insert(r.op);
      ranks.insert(r.ranks);
    }
    std::optional<std::vector<bench::rss_record>> rss;
    if (!rss_csv.empty()) rss = bench::read_rss_csv(rss_csv);

    for (bench::op_kind op : bench::every_op())
      if (ops.count(bench::op_name(op))) print_table(bench::op_name(op), cells);
    if (ops.count("heat")) print_heat(cells);
    if (!memcpy.empty()) print_memcpy(memcpy, cells, ranks);
    if (rss && !rss->empty()) print_rss(*rss);
    print_legend();
    lim.memcpy = &memcpy;
    print_targets(cells, memcpy, lim, rss);
    if (!plots.empty()) write_plots(plots, cells, memcpy, ops, ranks);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_report: %s\n", e.what());
    return 1;
  }
}
