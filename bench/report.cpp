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
// targets (those of an op the CSV has no row of are counted, not listed): each one's
// measured value, the goal and met / missed / not measured, and where the
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

#include "bench_common.hpp"

namespace {

/// The systems in column order: CSV (system, transport) -> column label.
const std::vector<std::pair<std::string, std::string>> columns = {
    {"troupe-inproc", "troupe inproc"},
    {"troupe-shm", "troupe shm"},
    {"troupe-shmstaged", "troupe staged"},
    {"troupe-tcp", "troupe tcp"},
    {"gloo-tcp", "gloo tcp"},
    {"mpi-shm", "mpi shm"},
    {"mpi-tcp", "mpi tcp"}};

using key = std::tuple<std::string, int, std::size_t>;  // op, ranks, bytes
using cell_map = std::map<key, std::map<std::string, bench::record>>;
using memcpy_map = std::map<std::size_t, bench::record>;   // bytes -> memcpy's record
using ceiling_key = std::pair<int, std::size_t>;           // ranks, bytes
using ceiling_map = std::map<ceiling_key, bench::record>;  // -> tcp-ceiling's record

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

/// NaN when the system has no row for this cell.
double time_of(const std::map<std::string, bench::record>& row, const std::string& sys) {
  auto it = row.find(sys);
  return it == row.end() ? NAN : it->second.median_us;
}

double busbw_of(const std::map<std::string, bench::record>& row, const std::string& sys) {
  auto it = row.find(sys);
  return it == row.end() ? NAN : it->second.busbw;
}

std::string fmt(const char* f, double v) {
  if (std::isnan(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

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

/// The record of one system (CSV system-transport) in one cell, if measured.
std::optional<bench::record> find(const cell_map& cells, const std::string& op, int n,
                                  std::size_t bytes, const std::string& sys) {
  auto it = cells.find({op, n, bytes});
  if (it == cells.end()) return std::nullopt;
  auto r = it->second.find(sys);
  if (r == it->second.end()) return std::nullopt;
  return r->second;
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

/// Per-rank share of an RSS line: one process holds every rank in-process.
double per_rank(const bench::rss_record& r, std::size_t v) {
  return r.transport == "inproc" ? double(v) / r.ranks : double(v);
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

/// The performance targets, each against this run's numbers; `note` (a line
/// of its own below the target) says what the machine allows.
struct target_row {
  std::string what, measured, goal, status, note;
  std::string heading = "";  ///< printed on a line of its own before the row
};

/// What the machine allows, measured in the same run.
struct limits {
  ceiling_map tcp;  ///< raw TCP exchange of 2 processes, or ring of more (tcp_exchange)
  std::map<int, bench::record> barrier;  ///< ranks -> flag_barrier's record
  const memcpy_map* memcpy = nullptr;
  int cpus = 1;  ///< CPUs the ranks share

  /// The least time (µs) of an allreduce of `bytes` over n ranks that share
  /// `cpus` CPUs, from memory bandwidth: each rank reads its input and writes
  /// its output, a memcpy of `bytes` at the least, and at most `cpus` of
  /// those run at once. Only from 1 MiB (below, fixed costs dominate).
  std::optional<double> memory_us(int n, std::size_t bytes) const {
    if (bytes < MiB || !memcpy) return std::nullopt;
    auto m = memcpy->find(bytes);
    if (m == memcpy->end()) return std::nullopt;
    return n * m->second.median_us / std::min(n, std::max(cpus, 1));
  }
  std::string memory_text(int n, std::size_t bytes) const {
    auto m = memcpy->find(bytes);
    char b[96];
    std::snprintf(b, sizeof b, "bound (memory bandwidth, %d ranks x memcpy %.4g us / %d CPUs)", n,
                  m->second.median_us, std::min(n, std::max(cpus, 1)));
    return b;
  }
};

const char* const reach_tcp = "out of reach (goal above the measured ceiling)";
const char* const reach_memory_busbw = "out of reach (goal above the memory-bandwidth bound)";
const char* const reach_memory_time = "out of reach (goal below the memory-bandwidth bound)";
const char* const reach_agreement = "out of reach (goal below the agreement bound)";

std::string ratio_text(double ratio, double a, double b, const char* unit) {
  char buf[96];
  // Three decimals in the usual range, so that 1.996 does not print as a met 2.
  const char* f = ratio >= 0.1 && ratio < 100 ? "%.3fx (%.3g / %.3g %s)" : "%.3gx (%.3g / %.3g %s)";
  std::snprintf(buf, sizeof buf, f, ratio, a, b, unit);
  return buf;
}

void print_targets(const cell_map& cells, const memcpy_map& memcpy, const limits& lim,
                   const std::optional<std::vector<bench::rss_record>>& rss) {
  std::vector<target_row> rows;
  const std::string na = "not measured";
  auto status = [](bool met) { return std::string(met ? "met" : "MISSED"); };
  auto label = [](std::size_t bytes) { return bench::size_label(bytes); };
  // A missed target beyond what the machine allows is out of reach instead.
  auto verdict = [&](bool met, bool beyond, const char* reach) {
    return met || !beyond ? status(met) : std::string(reach);
  };
  // Ranks in processes of their own over shared memory: the memory-bandwidth
  // bound applies (troupe's in-process targets are shown without it).
  auto in_memory = [](const std::string& mine) {
    return mine == "troupe-shm" || mine == "troupe-shmstaged";
  };

  // troupe busbw >= k x peer's busbw.
  // The ceiling and the memory bound are allreduce's: for other ops, none.
  auto busbw_vs = [&](const char* mine, const char* peer, const char* peer_name, int n,
                      std::size_t bytes, double k, const std::string& op = "allreduce") {
    const bool ar = op == "allreduce";
    auto a = find(cells, op, n, bytes, mine);
    auto b = find(cells, op, n, bytes, peer);
    target_row t{std::string(mine) + " " + std::to_string(n) + "r " + op + " " + label(bytes) +
                     (op == "pingpong" ? ": bandwidth / " : ": busbw / ") + peer_name,
                 na, fmt(">= %gx", k), na, ""};
    // The most busbw the machine allows (NaN: not known) and how it is named.
    double most = NAN;
    const char* reach = reach_tcp;
    if (ar && std::string(mine) == "troupe-tcp") {
      auto c = lim.tcp.find({n, bytes});
      t.note = n == 2 ? "ceiling (raw TCP exchange): " : "ceiling (raw TCP ring): ";
      if (c == lim.tcp.end()) {
        t.note += "not measured";
      } else {
        most = c->second.busbw;
        t.note += fmt("%.3g GB/s", most);
      }
    } else if (auto us = ar && in_memory(mine) ? lim.memory_us(n, bytes) : std::nullopt) {
      most = double(bytes) * bench::bus_factor(bench::op_kind::allreduce, n) / (*us * 1e-6) / 1e9;
      reach = reach_memory_busbw;
      t.note = lim.memory_text(n, bytes) + ": busbw <= " + fmt("%.3g GB/s", most);
    }
    if (!std::isnan(most))
      t.note += b ? fmt(" = %.3gx ", most / b->busbw) + peer_name
                  : std::string(" (") + peer_name + " not measured)";
    if (a && b) {
      const double r = a->busbw / b->busbw;
      t.measured = ratio_text(r, a->busbw, b->busbw, "GB/s");
      t.status = verdict(r >= k, most < k * b->busbw, reach);
    }
    rows.push_back(t);
  };
  // The least time of a barrier of n processes in this run (flag_barrier's
  // and every system's but troupe's in one process) and whose it is.
  auto least_barrier = [&](int n) -> std::optional<std::pair<double, std::string>> {
    std::optional<std::pair<double, std::string>> best;
    auto consider = [&](double us, const std::string& who) {
      if (!best || us < best->first) best = std::make_pair(us, who);
    };
    if (auto f = lim.barrier.find(n); f != lim.barrier.end())
      consider(f->second.median_us, "flag barrier");
    if (auto c = cells.find(key{"barrier", n, 0}); c != cells.end())
      for (const auto& [system, r] : c->second)
        if (system != "troupe-inproc") consider(r.median_us, system);
    return best;
  };
  // troupe time <= k x peer's time (strictly below when `strict`). With
  // `agreement` (the small collectives of processes over shared memory) the
  // least barrier of n processes bounds the time where the run measured one.
  auto time_vs = [&](const char* mine, const char* peer, const char* peer_name, int n,
                     std::size_t bytes, double k, bool strict, const std::string& op = "allreduce",
                     bool agreement = false) {
    auto a = find(cells, op, n, bytes, mine);
    auto b = find(cells, op, n, bytes, peer);
    target_row t{std::string(mine) + " " + std::to_string(n) + "r " + op + " " + label(bytes) +
                     ": time / " + peer_name,
                 na, fmt(strict ? "< %gx" : "<= %gx", k), na, ""};
    // The least time the machine allows (NaN: not known) and how it is named.
    double least = NAN;
    const char* reach = reach_memory_time;
    if (auto m = op == "allreduce" && in_memory(mine) ? lim.memory_us(n, bytes) : std::nullopt) {
      least = *m;
      t.note = lim.memory_text(n, bytes);
    } else if (auto f = agreement ? least_barrier(n) : std::nullopt) {
      least = f->first;
      reach = reach_agreement;
      t.note = "bound (agreement: every rank hears every rank; the fastest barrier of " +
               std::to_string(n) + " processes, " + f->second + ")";
    }
    if (!std::isnan(least))
      t.note += ": >= " + fmt("%.4g us", least) +
                (b ? fmt(" = %.3gx ", least / b->median_us) + peer_name
                   : std::string(" (") + peer_name + " not measured)");
    if (a && b) {
      const double r = a->median_us / b->median_us, goal_us = k * b->median_us;
      t.measured = ratio_text(r, a->median_us, b->median_us, "us");
      const bool beyond = strict ? least >= goal_us : least > goal_us;  // false for NaN
      t.status = verdict(strict ? r < k : r <= k, beyond, reach);
    }
    rows.push_back(t);
  };
  // troupe time < limit_us (<= when `inclusive`).
  auto time_below = [&](const char* mine, int n, std::size_t bytes, double limit_us,
                        const std::string& op = "allreduce", bool inclusive = false) {
    auto a = find(cells, op, n, bytes, mine);
    target_row t{std::string(mine) + " " + std::to_string(n) + "r " + op + " " + label(bytes) +
                     (op == "pingpong" ? ": one-way time" : ": time"),
                 na, fmt(inclusive ? "<= %g us" : "< %g us", limit_us), na, ""};
    const auto least =
        op == "allreduce" && in_memory(mine) ? lim.memory_us(n, bytes) : std::nullopt;
    if (least) t.note = lim.memory_text(n, bytes) + ": >= " + fmt("%.4g us", *least);
    if (a) {
      t.measured = fmt(op == "allreduce" ? "%.1f us" : "%.2f us", a->median_us);
      const bool met = inclusive ? a->median_us <= limit_us : a->median_us < limit_us;
      t.status = verdict(met, least && *least >= limit_us, reach_memory_time);
    }
    rows.push_back(t);
  };

  // Shared memory, 2 ranks, against OpenMPI over shared memory.
  busbw_vs("troupe-shm", "mpi-shm", "mpi shm", 2, MiB, 2.0);
  busbw_vs("troupe-shm", "mpi-shm", "mpi shm", 2, 16 * MiB, 2.5);
  busbw_vs("troupe-shm", "mpi-shm", "mpi shm", 2, 64 * MiB, 4.0);
  time_below("troupe-shm", 2, 4, 10.0);
  // TCP, 2 ranks, against Gloo.
  busbw_vs("troupe-tcp", "gloo-tcp", "gloo tcp", 2, 16 * MiB, 1.5);
  busbw_vs("troupe-tcp", "gloo-tcp", "gloo tcp", 2, 64 * MiB, 1.5);
  for (std::size_t b : {std::size_t(4), KiB, 64 * KiB})
    time_vs("troupe-tcp", "gloo-tcp", "gloo tcp", 2, b, 0.25, false);
  // 4 ranks over shared memory.
  time_vs("troupe-shm", "mpi-shm", "mpi shm", 4, KiB, 2.0, false);
  time_vs("troupe-shm", "mpi-shm", "mpi shm", 4, MiB, 1.0, true);
  time_vs("troupe-shm", "mpi-shm", "mpi shm", 4, 16 * MiB, 1.0, true);
  for (std::size_t b : {std::size_t(4), KiB, 64 * KiB, MiB, 16 * MiB})
    time_vs("troupe-shm", "gloo-tcp", "gloo tcp", 4, b, 0.1, false);
  // In one process, 2 ranks.
  {
    auto a = find(cells, "allreduce", 2, 64 * MiB, "troupe-inproc");
    target_row t{"troupe-inproc 2r allreduce 64 MiB: busbw", na, ">= 12 GB/s", na, ""};
    if (a) {
      t.measured = fmt("%.2f GB/s", a->busbw);
      t.status = status(a->busbw >= 12.0);
    }
    rows.push_back(t);
  }
  time_below("troupe-inproc", 2, MiB, 30.0);
  // The large shared-memory targets again on tensors kept private (staged
  // through the segment, as borrowed memory is): reported, not targets.
  auto reported = [&](std::size_t from) {
    for (std::size_t i = from; i < rows.size(); ++i) {
      if (rows[i].status != na) rows[i].status = "-";
      rows[i].goal = "(reported)";
    }
  };
  const auto staged_from = rows.size();
  busbw_vs("troupe-shmstaged", "mpi-shm", "mpi shm", 2, 16 * MiB, 2.5);
  busbw_vs("troupe-shmstaged", "mpi-shm", "mpi shm", 2, 64 * MiB, 4.0);
  time_vs("troupe-shmstaged", "mpi-shm", "mpi shm", 4, 16 * MiB, 1.0, true);
  time_vs("troupe-shmstaged", "gloo-tcp", "gloo tcp", 4, 16 * MiB, 0.1, false);
  reported(staged_from);
  for (std::size_t b : {MiB, 64 * MiB}) {
    auto a = find(cells, "allreduce", 2, b, "troupe-inproc");
    auto m = memcpy.find(b);
    target_row t{"troupe-inproc 2r allreduce " + label(b) + ": busbw / memcpy", na, "(reported)",
                 na, ""};
    if (a && m != memcpy.end()) {
      t.measured = ratio_text(a->busbw / m->second.busbw, a->busbw, m->second.busbw, "GB/s");
      t.status = "-";
    }
    rows.push_back(t);
  }
  // Peak resident memory per rank during a 64 MiB allreduce.
  bool any_rss = false;
  if (rss)
    for (const auto& r : *rss) {
      if (r.system != "troupe") continue;
      any_rss = true;
      const double ratio = per_rank(r, r.peak_bytes) / double(r.tensor_bytes);
      rows.push_back(
          {"troupe-" + r.transport + " " + std::to_string(r.ranks) + "r peak RSS/rank, " +
               label(r.tensor_bytes) + " allreduce",
           fmt("%.2fx tensor", ratio) + fmt(" (%.0f MiB)", per_rank(r, r.peak_bytes) / double(MiB)),
           "< 2.5x tensor", status(ratio < 2.5), ""});
    }
  if (!any_rss)
    rows.push_back({"troupe peak RSS/rank, 64 MiB allreduce", na, "< 2.5x tensor", na, ""});

  // The targets of point-to-point and of the ops outside the default run.
  // A target of an op the CSV has no row of (not in the run's --ops) is
  // counted in `not_run` instead of listed as not measured.
  std::map<std::string, int> not_run;
  auto has_op = [&](const std::string& op) {
    return std::any_of(cells.begin(), cells.end(),
                       [&](const auto& c) { return std::get<0>(c.first) == op; });
  };
  // Adds the rows `add` makes when `op` ran, else counts them; the first row
  // added after a call with a heading carries it.
  std::string heading;
  auto group = [&](const std::string& op, const auto& add) {
    const auto from = rows.size();
    add();
    if (!has_op(op)) {
      not_run[op] += int(rows.size() - from);
      rows.resize(from);
    } else if (rows.size() > from && !heading.empty()) {
      rows[from].heading = heading;
      heading.clear();
    }
  };
  heading = "point to point: pingpong (2 ranks, one-way = round trip / 2) and halo";
  group("pingpong", [&] {
    time_below("troupe-inproc", 2, 4, 1.0, "pingpong", true);
    time_below("troupe-shm", 2, 4, 1.0, "pingpong", true);
    for (std::size_t b : {MiB, 16 * MiB})
      busbw_vs("troupe-shm", "mpi-shm", "mpi shm", 2, b, 1.5, "pingpong");
  });
  group("halo", [&] {
    for (std::size_t b : {8 * KiB, MiB})
      time_vs("troupe-shm", "mpi-shm", "mpi shm", 4, b, 1.0, false, "halo");
  });
  // The size a row of `op` has for a nominal size (4 B of an allgather with
  // 4 ranks is a 16 B row: per-rank blocks of at least one element).
  auto row_bytes = [](const std::string& op, std::size_t nominal, int n) {
    for (bench::op_kind k : bench::every_op())
      if (op == bench::op_name(k)) return bench::make_layout(k, nominal, n).bytes;
    return nominal;
  };
  // Every collective at 4 B and 1 KiB (barrier: its one row) against OpenMPI
  // over shared memory; 4r allreduce 1 KiB is the target above already.
  heading = "small collectives over shared memory: <= 2x OpenMPI (2 and 4 ranks)";
  for (const char* op : {"allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall",
                         "reduce", "gather", "scatter", "barrier"})
    group(op, [&] {
      for (int n : {2, 4}) {
        if (std::string(op) == "barrier") {
          time_vs("troupe-shm", "mpi-shm", "mpi shm", n, 0, 2.0, false, op);
          continue;
        }
        for (std::size_t b : {std::size_t(4), KiB})
          if (!(std::string(op) == "allreduce" && n == 4 && b == KiB))
            time_vs("troupe-shm", "mpi-shm", "mpi shm", n, row_bytes(op, b, n), 2.0, false, op,
                    true);
      }
    });
  heading = "reduce, gather, scatter from 64 KiB over shared memory: <= 1x OpenMPI";
  for (const char* op : {"reduce", "gather", "scatter"})
    group(op, [&] {
      for (int n : {2, 4})
        for (std::size_t b : {64 * KiB, MiB, 16 * MiB, 64 * MiB})
          time_vs("troupe-shm", "mpi-shm", "mpi shm", n, row_bytes(op, b, n), 1.0, false, op);
    });
  // TCP with 4 ranks (the 2-rank targets above are against Gloo at 1.5x).
  heading = "forced TCP, 4 ranks: allreduce against Gloo and OpenMPI over TCP";
  group("allreduce", [&] {
    for (std::size_t b : {16 * MiB, 64 * MiB})
      busbw_vs("troupe-tcp", "gloo-tcp", "gloo tcp", 4, b, 1.3);
    for (std::size_t b : {16 * MiB, 64 * MiB})
      time_vs("troupe-tcp", "mpi-tcp", "mpi tcp", 4, b, 1.0, false);
  });

  int met = 0, missed = 0, unreachable = 0, unmeasured = 0;
  std::printf("\n### targets (troupe, from this run; r = ranks)\n\n%-52s %-32s %-14s %s\n",
              "target", "measured", "goal", "status");
  for (const auto& t : rows) {
    if (!t.heading.empty()) std::printf("\n%s\n", t.heading.c_str());
    std::printf("%-52s %-32s %-14s %s\n", t.what.c_str(), t.measured.c_str(), t.goal.c_str(),
                t.status.c_str());
    if (!t.note.empty()) std::printf("    %s\n", t.note.c_str());
    met += t.status == "met";
    missed += t.status == "MISSED";
    unreachable += t.status.rfind("out of reach", 0) == 0;
    unmeasured += t.status == na;
  }
  std::printf(
      "\n%d met, %d missed, %d out of reach, %d not measured (a size the run did not reach, a\n"
      "peer not installed, or no rss.csv). Ratios: busbw targets = troupe busbw / peer busbw\n"
      "(above 1: troupe is faster); time targets = troupe time / peer time (below 1: troupe is\n"
      "faster). RSS: VmHWM per rank (in-process: the process's divided by the ranks) over the\n"
      "tensor. Out of reach: missed, with the goal beyond the ceiling or bound printed below\n"
      "the target (%d CPUs); a met target's ceiling or bound is shown too.\n",
      met, missed, unreachable, unmeasured, lim.cpus);
  if (!not_run.empty()) {
    std::string list;
    for (const auto& [op, count] : not_run)
      list += (list.empty() ? "" : ", ") + op + " " + std::to_string(count);
    std::printf(
        "Not listed: the targets of ops this run did not measure (run_bench.sh --ops): %s.\n",
        list.c_str());
  }
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
