// report_targets — the collectives benchmark's performance targets
// (report_common.hpp): each against this run's numbers, and where the run
// measured what the machine allows, whether a missed one is out of reach.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "report_common.hpp"

namespace report {
namespace {

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

}  // namespace

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

}  // namespace report
