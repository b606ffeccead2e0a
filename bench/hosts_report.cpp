// bench_hosts_report — the collectives benchmark across emulated hosts
// (bench/hosts_bench.sh): reads the CSV its workers wrote and prints, per
// collective, the time of troupe, Gloo and OpenMPI (TCP alone, and shared
// memory inside a host + TCP across) in the same topology, the bound the
// hosts' links set, the ratios, the bus bandwidths, then the targets.
//
//   bench_hosts_report hosts.csv --hosts H --ranks-per-host R --link RATE|none
//                      [--cpus-per-host C]   (the model's CPUs of a host: the
//                      ranks share them where C < R; 0, the default: one each)
//                      [--link-costs TEXT]   (what the ranks were told in
//                      TROUPE_LINK_COSTS; default: the link's rate at 95%)
//                      [--chosen-with TEXT]  (what the ranks were told, where
//                      --link-costs is what the model prices with: measured
//                      later, in the tables' own launches)
//   bench_hosts_report calibration.csv --fit --hosts H ... [--fit-launch hosts.csv]
//                      prints the cost model's terms measured there, as
//                      TROUPE_LINK_COSTS items (fit_costs below); with
//                      --fit-launch, the layout's barrier (hop_wait) from
//                      the tables' own launches, where they ran one
//
// The link's bound of a collective: the bytes a host must send (or receive)
// across its link when the algorithm moves each host's data across once
// (reduced or gathered inside the host first), at the link's rate; links are
// full duplex, so sending and receiving overlap. For N bytes (nccl-tests'
// size: allgather's output, reduce_scatter's input, alltoall's input of one
// rank) over H hosts of R ranks:
//   allreduce       2(H-1)/H x N  (reduce-scatter + allgather between hosts)
//   broadcast       N             (every other host receives the whole buffer)
//   reduce          N             (every other host sends its partial sum once)
//   allgather       (H-1)/H x N   (each host receives the other hosts' blocks)
//   reduce_scatter  (H-1)/H x N   (each host receives its blocks' partial sums)
//   alltoall        R(H-1)/H x N  (every rank's blocks for other hosts; nothing combines)
// Bytes are the payload: TCP/IP and Ethernet headers (1500-byte MTU) leave at
// most about 95% of the rate to it, so 0.95 of the bound is about the most a
// system can reach in the long run. tbf's bucket (1 ms at the rate, at least
// 64 KiB: less and tbf falls short of the rate) lets a burst that size pass at
// once, so small transfers can beat the bound.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "algorithms/cost_fit.hpp"
#include "algorithms/topology.hpp"
#include "api/layout_model.hpp"
#include "bench_common.hpp"
#include "troupe/simulation.hpp"

namespace {

/// Columns: CSV system-transport -> label.
const std::vector<std::pair<std::string, std::string>> columns = {{"troupe-shm+tcp", "troupe"},
                                                                  {"gloo-tcp", "gloo tcp"},
                                                                  {"mpi-tcp", "mpi tcp"},
                                                                  {"mpi-shm+tcp", "mpi shm+tcp"}};

constexpr std::size_t MiB = 1024 * 1024;

struct topology {
  int hosts = 0, per_host = 0;
  std::string link = "none";
  double bits_per_s = 0;     ///< 0: unshaped
  double cpus_per_host = 0;  ///< 0: a CPU for each rank
  std::string costs;         ///< --link-costs: what the ranks were told (TROUPE_LINK_COSTS)
  std::string chosen_with;   ///< --chosen-with: what they were told where `costs` came later
  int ranks() const { return hosts * per_host; }
};

/// "1gbit" -> 1e9 (tc's decimal units); throws on anything else.
double parse_rate(const std::string& s) {
  std::size_t used = 0;
  const double v = std::stod(s, &used);
  const std::string unit = s.substr(used);
  const std::map<std::string, double> units = {
      {"bit", 1}, {"kbit", 1e3}, {"mbit", 1e6}, {"gbit", 1e9}, {"tbit", 1e12}};
  auto u = units.find(unit);
  if (u == units.end() || !(v > 0))
    throw std::invalid_argument("--link: expected a rate such as 1gbit, or none; got '" + s + "'");
  return v * u->second;
}

/// Bytes each host's link carries for `op` of `bytes` (see the header); 0: no bound.
double link_bytes(const std::string& op, std::size_t bytes, const topology& t) {
  const double n = double(bytes), h = t.hosts;
  if (op == "allreduce") return 2 * (h - 1) / h * n;
  if (op == "broadcast" || op == "reduce") return n;
  if (op == "allgather" || op == "reduce_scatter") return (h - 1) / h * n;
  if (op == "alltoall") return t.per_host * (h - 1) / h * n;
  return 0;
}

/// The link's bound in µs; NaN where there is none (unshaped, one host, other ops).
double bound_us(const std::string& op, std::size_t bytes, const topology& t) {
  const double b = link_bytes(op, bytes, t);
  if (t.bits_per_s <= 0 || b <= 0) return NAN;
  return b * 8 / t.bits_per_s * 1e6;
}

std::string fmt(const char* f, double v) {
  if (std::isnan(v)) return "-";
  char b[48];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

using row_map = std::map<std::string, bench::record>;  // system -> record
using op_rows = std::map<std::size_t, row_map>;        // bytes -> row
std::map<std::string, op_rows> cells;                  // op -> rows

double time_of(const row_map& row, const std::string& sys) {
  auto it = row.find(sys);
  return it == row.end() ? NAN : it->second.median_us;
}

void print_table(const std::string& op, const topology& t) {
  auto rows = cells.find(op);
  if (rows == cells.end()) return;
  std::printf(
      "\n### %s (float32), %d hosts x %d ranks, link %s: time per op (us), ratios troupe / "
      "peer\n\n",
      op.c_str(), t.hosts, t.per_host, t.link.c_str());
  std::printf("%8s |", "size");
  for (auto& c : columns) std::printf(" %12s", c.second.c_str());
  std::printf(" | %11s | %9s %9s %11s | %8s\n", "link bound", "/gloo", "/mpi tcp", "/mpi shm+tcp",
              "of bound");
  for (const auto& [bytes, row] : rows->second) {
    std::printf("%8s |", bench::size_label(bytes).c_str());
    for (auto& c : columns) std::printf(" %12s", fmt("%.1f", time_of(row, c.first)).c_str());
    const double mine = time_of(row, "troupe-shm+tcp"), bound = bound_us(op, bytes, t);
    std::printf(" | %11s | %9s %9s %11s | %8s\n", fmt("%.1f", bound).c_str(),
                fmt("%.2f", mine / time_of(row, "gloo-tcp")).c_str(),
                fmt("%.2f", mine / time_of(row, "mpi-tcp")).c_str(),
                fmt("%.2f", mine / time_of(row, "mpi-shm+tcp")).c_str(),
                fmt("%.2f", bound / mine).c_str());
  }
  std::printf("\n%s bus bandwidth (GB/s), and the fraction of the link's bound reached:\n\n",
              op.c_str());
  std::printf("%8s |", "size");
  for (auto& c : columns) std::printf(" %12s", c.second.c_str());
  std::printf(" | %11s |", "link allows");
  for (auto& c : columns) std::printf(" %12s", c.second.c_str());
  std::printf("\n");
  const double factor = [&] {
    for (bench::op_kind k : bench::all_ops())
      if (op == bench::op_name(k)) return bench::bus_factor(k, t.ranks());
    return 1.0;
  }();
  for (const auto& [bytes, row] : rows->second) {
    std::printf("%8s |", bench::size_label(bytes).c_str());
    for (auto& c : columns) {
      auto it = row.find(c.first);
      std::printf(" %12s", fmt("%.3f", it == row.end() ? NAN : it->second.busbw).c_str());
    }
    const double bound = bound_us(op, bytes, t);
    std::printf(" | %11s |", fmt("%.3f", double(bytes) * factor / (bound * 1e-6) / 1e9).c_str());
    for (auto& c : columns)
      std::printf(" %12s", fmt("%.2f", bound / time_of(row, c.first)).c_str());
    std::printf("\n");
  }
}

void print_legend(const topology& t) {
  std::printf(
      "\nsystems: troupe = troupe-run on every host (ranks of a host over shared memory,\n"
      "  hosts over TCP); gloo tcp = Gloo's TCP pairs between every two ranks; mpi tcp =\n"
      "  OpenMPI with btl self,tcp (TCP inside a host too); mpi shm+tcp = btl self,vader,tcp.\n"
      "times: the slowest rank's time, median over the timed iterations after warm-up (the\n"
      "  lower median of the rounds); every result checked before timing. ratios: TIME\n"
      "  ratios troupe / peer (below 1: troupe is faster). busbw as nccl-tests over all %d\n"
      "  ranks.\n",
      t.ranks());
  if (t.bits_per_s > 0)
    std::printf(
        "link bound: the bytes each host must move across its link (%s, full duplex) when\n"
        "  each host's data crosses once, at the link's rate: allreduce 2(H-1)/H x N (a\n"
        "  reduce-scatter + allgather between hosts, done once per host), broadcast and\n"
        "  reduce N, allgather and reduce_scatter (H-1)/H x N, alltoall R(H-1)/H x N (H\n"
        "  hosts, R ranks each, N the size). 'of bound' = bound / time: 1 is the link's rate;\n"
        "  TCP/IP headers over a 1500-byte MTU leave about 0.95 of it to the payload.\n"
        "  The shaper's bucket holds 1 ms at the rate (at least 64 KiB): a burst that size\n"
        "  passes at once, so below about 1 MiB a transfer can beat the bound.\n",
        t.link.c_str());
  else
    std::printf("link: unshaped (veth through a bridge; no bound: the CPUs are the limit).\n");
}

struct target {
  std::string what, measured, goal, status;
};

/// The payload rate a shaped link leaves, 95% of it, as TROUPE_LINK_COSTS
/// writes a rate ("118750000B/s"); "" where the link is unshaped.
std::string payload_rate(const topology& t) {
  return t.bits_per_s > 0 ? fmt("%.0f", t.bits_per_s / 8 * 0.95) + "B/s" : "";
}

/// The shaped link's bucket as the model's item (",burst=..."): what
/// scripts/hosts.sh gives tbf (1 ms at the rate, at least 64 KiB), at 95%
/// for the payload; nothing where the link is unshaped.
std::string link_burst(const topology& t) {
  if (!(t.bits_per_s > 0)) return "";
  return ",burst=" + fmt("%.0f", std::max(t.bits_per_s / 8 / 1000, 65536.0) * 0.95) + "B";
}

/// troupe's measured times against testing::predict's for the same layout
/// (the cost model the ranks choose by; the link's rate at 95% for the
/// payload when shaped, the model's defaults otherwise): the ratio, and how
/// many sizes fall within 25%.
void print_model(const topology& t) {
  const std::string costs = !t.costs.empty()   ? t.costs
                            : t.bits_per_s > 0 ? "host=:" + payload_rate(t) + link_burst(t)
                                               : "";
  std::printf(
      "\n### the cost model against the measurement (troupe, %d hosts x %d ranks, link %s)\n\n",
      t.hosts, t.per_host, t.link.c_str());
  std::printf(
      "%-10s %8s | %-26s %12s %12s %8s\n", "op", "size",
      t.chosen_with.empty() ? "algorithm (model's choice)" : "algorithm (the ranks' choice)",
      "predicted", "measured", "meas/pred");
  int within = 0, compared = 0;
  for (const char* op : {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter"}) {
    auto rows = cells.find(op);
    if (rows == cells.end()) continue;
    for (const auto& [bytes, row] : rows->second) {
      const double measured = time_of(row, "troupe-shm+tcp");
      if (std::isnan(measured)) continue;
      const troupe::testing::host_layout layout{t.hosts, t.per_host, t.cpus_per_host};
      const auto p = t.chosen_with.empty() ? troupe::testing::predict(op, bytes, layout, costs)
                                           : troupe::testing::predict_chosen_with(
                                                 op, bytes, layout, costs, t.chosen_with);
      const double predicted = p.seconds * 1e6, ratio = measured / predicted;
      ++compared;
      within += ratio >= 0.75 && ratio <= 1.25;
      std::printf("%-10s %8s | %-26s %12s %12s %8s\n", op, bench::size_label(bytes).c_str(),
                  p.algorithm.c_str(), fmt("%.1f", predicted).c_str(),
                  fmt("%.1f", measured).c_str(), fmt("%.2f", ratio).c_str());
    }
  }
  std::printf(
      "\nmodel: %d of %d sizes within 25%% of the measurement (times in us; model: %s; %s)\n",
      within, compared, costs.empty() ? "the defaults" : costs.c_str(),
      t.cpus_per_host > 0 && t.cpus_per_host < t.per_host
          ? fmt("%.2f ranks per CPU", t.per_host / t.cpus_per_host).c_str()
          : "a CPU for each rank");
}

/// The cost model's terms measured on these hosts (hosts_bench.sh
/// --calibrate wrote `cal`), as TROUPE_LINK_COSTS items: the latency
/// between hosts, a 4-byte ping-pong's one-way time between two hosts of a
/// rank each; the TCP bytes a rank's CPU moves per second, the rate at
/// which the model's time for a 16 MiB allreduce of those two ranks is the
/// one measured, and for a call the CPU's cache holds (cpu_cached) that of
/// their 1 MiB allreduce; the sender's share of that work (cpu_send,
/// cpu_send_cached) from their 16 MiB and 1 MiB ping-pongs' one-way times
/// (optional rows); where the layout's ranks share CPUs, hop_wait, at
/// which the model's time for a barrier of the whole layout is the one
/// measured (shared_wait 0), and wait_share, at which its one-way 16 MiB
/// send between two of the layout's hosts (the others waiting) is the
/// layout's ping-pong's (optional rows); and where two ranks of one host ran over the
/// shared-memory rings (transport "rings": the message engine, as the
/// hierarchies' stages within a host), the local link's bandwidth at which
/// their 16 MiB allreduce takes what it measured (local_cached: their
/// 1 MiB one); and the work of each further message between hosts
/// (overhead), at which the model's pairwise alltoall of the layout takes
/// what it measured (optional rows). Each term from a different call than the tables compare the
/// model with. Throws where a measurement is missing (the rings' are
/// optional: without them the local link keeps its default). `launch`:
/// rows of the tables' own launches; where they hold a troupe barrier of
/// the layout, hop_wait comes from it (at 4 ranks per CPU the pace of a hop
/// moved 30-40% between launches minutes apart, so a calibrating launch's
/// barrier can miss the tables' pace).
std::string fit_costs(const std::vector<bench::record>& cal, const topology& t,
                      const std::vector<bench::record>& launch = {}) {
  // The lower median of troupe's rounds in `rows`, as the tables keep.
  auto lowest_in = [](const std::vector<bench::record>& rows, const char* op, int ranks,
                      std::size_t bytes, bool rings) {
    double lowest = NAN;
    for (const auto& r : rows)
      if (r.system == "troupe" && (r.transport == "rings") == rings && r.op == op &&
          r.ranks == ranks && r.bytes == bytes && !(r.median_us >= lowest))
        lowest = r.median_us;
    return lowest;
  };
  auto lowest_of = [&](const char* op, int ranks, std::size_t bytes, bool rings) {
    return lowest_in(cal, op, ranks, bytes, rings);
  };
  auto measured = [&](const char* op, int ranks, std::size_t bytes) {
    const double lowest = lowest_of(op, ranks, bytes, false);
    if (!std::isnan(lowest)) return lowest;
    throw std::invalid_argument(std::string("--fit: no troupe ") + op + " of " +
                                std::to_string(ranks) + " ranks, " + std::to_string(bytes) +
                                " bytes, in the calibration");
  };
  using troupe::detail::solve_for;
  const std::string latency = "host=" + fmt("%.2f", measured("pingpong", 2, 4)) + "us:";
  const double exchange = measured("allreduce", 2, 16 * MiB) * 1e-6;
  const double cpu = solve_for(
      [&](double c) {
        return troupe::testing::predict("allreduce", 16 * MiB, {2, 1, 0},
                                        latency + ",cpu=" + fmt("%.0f", c) + "B/s")
            .seconds;
      },
      exchange, 1e7, 1e12, true);
  const std::string cpu_term = ",cpu=" + fmt("%.0f", cpu) + "B/s";
  std::string costs = latency + payload_rate(t) + link_burst(t) + cpu_term;
  // The same two ranks' 1 MiB allreduce, which the cache holds.
  const double cached = solve_for(
      [&](double c) {
        return troupe::testing::predict(
                   "allreduce", MiB, {2, 1, 0},
                   latency + cpu_term + ",cpu_cached=" + fmt("%.0f", c) + "B/s")
            .seconds;
      },
      measured("allreduce", 2, MiB) * 1e-6, 1e7, 1e12, true);
  const std::string cached_term = ",cpu_cached=" + fmt("%.0f", cached) + "B/s";
  costs += cached_term;
  // The sender's share of that work, at which the model's one-way transfer
  // between them (a broadcast of two ranks) takes what the ping-pong's
  // one-way time measured, 16 MiB (cpu_send) and 1 MiB (cpu_send_cached);
  // from 0.5 (as much on either side) to 1.
  // (Measured unshaped, as the CPU rates: the link's rate left out.)
  const std::string unshaped = latency + cpu_term + cached_term;
  for (const auto& [bytes, term] :
       {std::pair{16 * MiB, ",cpu_send="}, std::pair{MiB, ",cpu_send_cached="}}) {
    const double one_way = lowest_of("pingpong", 2, bytes, false);
    if (std::isnan(one_way)) continue;  // older calibrations: as much on either side
    const double share = solve_for(
        [&](double f) {
          return troupe::testing::predict("broadcast", bytes, {2, 1, 0},
                                          unshaped + term + fmt("%.4f", f))
              .seconds;
        },
        one_way * 1e-6, 0.5, 1, false);
    costs += term + fmt("%.3f", share);
  }
  // Two ranks of one host over the rings, a CPU each.
  const double ring_uncached = lowest_of("allreduce", 2, 16 * MiB, true);
  const double ring_cached = lowest_of("allreduce", 2, MiB, true);
  if (!std::isnan(ring_uncached) && !std::isnan(ring_cached)) {
    // The rate `term` names at which the model's allreduce of `bytes` takes
    // `us`, added to the costs.
    auto fit_ring = [&](std::size_t bytes, const std::string& term, double us) {
      const double rate = solve_for(
          [&](double b) {
            return troupe::testing::predict("allreduce", bytes, {1, 2, 0},
                                            costs + term + fmt("%.0f", b) + "B/s")
                .seconds;
          },
          us * 1e-6, 1e7, 1e12, true);
      costs += term + fmt("%.0f", rate) + "B/s";
    };
    fit_ring(16 * MiB, ",local=:", ring_uncached);
    fit_ring(MiB, ",local_cached=", ring_cached);
  }
  // The pairwise alltoall of the layout (every rank sending each other rank
  // a message at once; hosts_bench.sh runs it forced, 4 bytes a block):
  // optional rows, older calibrations keep the default overhead.
  std::size_t alltoall_bytes = 0;  // the smallest measured
  for (const auto& r : cal)
    if (r.system == "troupe" && r.op == "alltoall" && r.ranks == t.ranks() &&
        (alltoall_bytes == 0 || r.bytes < alltoall_bytes))
      alltoall_bytes = r.bytes;
  const double alltoall = lowest_of("alltoall", t.ranks(), alltoall_bytes, false) * 1e-6;
  const troupe::testing::host_layout layout{t.hosts, t.per_host, t.cpus_per_host};
  // Each hop's wait for its receiver's CPU where ranks share CPUs (the
  // barrier: every rank receiving in each round), and the work of each
  // further message between hosts (the alltoall), as a world's `measure`
  // fits them (cost_fit.hpp, fit_sharing).
  const bool sharing = t.cpus_per_host > 0 && t.cpus_per_host < t.per_host;
  std::string overhead;  // last, as before the two were fitted together
  {
    std::vector<std::string> names;
    for (int r = 0; r < t.ranks(); ++r) names.push_back(std::to_string(r / t.per_host));
    troupe::detail::layout_sample sample;
    if (sharing) {
      const double in_launch = lowest_in(launch, "barrier", t.ranks(), 0, false);
      sample.barrier =
          (std::isnan(in_launch) ? measured("barrier", t.ranks(), 0) : in_launch) * 1e-6;
    }
    if (!std::isnan(alltoall)) {
      sample.alltoall = alltoall;
      sample.block = double(alltoall_bytes) / t.ranks();
    }
    const auto fitted =
        troupe::detail::fit_sharing(troupe::detail::layout_model(layout, costs, "--fit"),
                                    *troupe::detail::group_topology::of_hosts(names), sample);
    if (sharing) costs += ",hop_wait=" + fmt("%.2f", fitted.hop_wait * 1e6) + "us,shared_wait=0";
    if (!std::isnan(alltoall))
      overhead = ",overhead=" + fmt("%.2f", fitted.host.overhead * 1e6) + "us";
  }
  if (sharing) {
    // The CPU a waiting rank takes from a working one (wait_share), at
    // which the model's one-way 16 MiB send between two hosts of the layout
    // (rank 0 and rank n / 2, the others waiting) takes what the layout's
    // ping-pong measured (optional rows: older calibrations keep 0.5).
    // (Measured unshaped, as the CPU rates: the link's rate and bucket
    // overridden.)
    const double one_way = lowest_of("pingpong", t.ranks(), 16 * MiB, false);
    if (!std::isnan(one_way)) {
      const std::string unbounded = costs + ",host=:1000GB/s,burst=0B,wait_share=";
      const double share = solve_for(
          [&](double w) {
            return troupe::testing::predict("send", 16 * MiB, layout, unbounded + fmt("%.4f", w))
                .seconds;
          },
          one_way * 1e-6, 0, 1, false);
      costs += ",wait_share=" + fmt("%.3f", share);
    }
  }
  return costs + overhead;
}

void print_targets(const topology& t) {
  std::vector<target> rows;
  const std::string na = "not measured";
  auto find = [&](const std::string& op, std::size_t bytes,
                  const std::string& sys) -> std::optional<bench::record> {
    auto o = cells.find(op);
    if (o == cells.end()) return std::nullopt;
    auto r = o->second.find(bytes);
    if (r == o->second.end()) return std::nullopt;
    auto s = r->second.find(sys);
    if (s == r->second.end()) return std::nullopt;
    return s->second;
  };
  const bool shaped = t.bits_per_s > 0;
  const bool topo = t.hosts == 2 && t.per_host == 2;
  auto busbw_vs = [&](std::size_t bytes, const char* peer, const char* name, double k) {
    target r{"allreduce " + bench::size_label(bytes) + ": busbw / " + name, na, fmt(">= %gx", k),
             na};
    auto a = find("allreduce", bytes, "troupe-shm+tcp"), b = find("allreduce", bytes, peer);
    if (topo && a && b) {
      const double q = a->busbw / b->busbw;
      r.measured = fmt("%.3fx", q) + fmt(" (%.3g / ", a->busbw) + fmt("%.3g GB/s)", b->busbw);
      r.status = q >= k ? "met" : "MISSED";
    }
    rows.push_back(r);
  };
  if (shaped) {
    {
      target r{"allreduce 64 MiB: of the link's bound", na, ">= 0.85", na};
      auto a = find("allreduce", 64 * MiB, "troupe-shm+tcp");
      if (topo && a) {
        const double q = bound_us("allreduce", 64 * MiB, t) / a->median_us;
        r.measured = fmt("%.3f", q) +
                     fmt(" (bound %.4g ms / ", bound_us("allreduce", 64 * MiB, t) / 1e3) +
                     fmt("%.4g ms)", a->median_us / 1e3);
        r.status = q >= 0.85 ? "met" : "MISSED";
      }
      rows.push_back(r);
    }
    busbw_vs(64 * MiB, "gloo-tcp", "gloo", 1.3);
    {
      target r{"allreduce 4 B: time / gloo", na, "<= 0.25x", na};
      auto a = find("allreduce", 4, "troupe-shm+tcp"), b = find("allreduce", 4, "gloo-tcp");
      if (topo && a && b) {
        const double q = a->median_us / b->median_us;
        r.measured =
            fmt("%.3fx", q) + fmt(" (%.3g / ", a->median_us) + fmt("%.3g us)", b->median_us);
        r.status = q <= 0.25 ? "met" : "MISSED";
      }
      rows.push_back(r);
    }
  } else {
    busbw_vs(64 * MiB, "gloo-tcp", "gloo", 1.5);
    busbw_vs(64 * MiB, "mpi-tcp", "mpi tcp", 1.0);
  }
  std::printf("\n### targets across hosts (troupe, 2 hosts x 2 ranks, link %s%s)\n\n",
              shaped ? t.link.c_str() : "unshaped",
              shaped && t.bits_per_s != 1e9 ? "; set for 1gbit" : "");
  std::printf("%-42s %-40s %-10s %s\n", "target", "measured", "goal", "status");
  int met = 0, missed = 0, unmeasured = 0;
  for (const auto& r : rows) {
    std::printf("%-42s %-40s %-10s %s\n", r.what.c_str(), r.measured.c_str(), r.goal.c_str(),
                r.status.c_str());
    met += r.status == "met";
    missed += r.status == "MISSED";
    unmeasured += r.status == na;
  }
  std::printf("\n%d met, %d missed, %d not measured%s.\n", met, missed, unmeasured,
              topo ? "" : " (the targets are set for 2 hosts x 2 ranks)");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2) throw std::invalid_argument("give the CSV file");
    topology t;
    bool fit = false;
    std::vector<bench::record> launch;  // --fit-launch
    for (int i = 2; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--fit") {
        fit = true;
        continue;
      }
      if (i + 1 >= argc) throw std::invalid_argument(a + " expects a value");
      const std::string v = argv[++i];
      if (a == "--hosts")
        t.hosts = std::stoi(v);
      else if (a == "--ranks-per-host")
        t.per_host = std::stoi(v);
      else if (a == "--link")
        t.link = v;
      else if (a == "--cpus-per-host")
        t.cpus_per_host = std::stod(v);
      else if (a == "--link-costs")
        t.costs = v;
      else if (a == "--chosen-with")
        t.chosen_with = v;
      else if (a == "--fit-launch")
        launch = bench::read_csv(v);
      else
        throw std::invalid_argument("unknown argument '" + a + "'");
    }
    if (t.hosts < 1 || t.per_host < 1)
      throw std::invalid_argument("give --hosts H and --ranks-per-host R");
    if (t.link != "none") t.bits_per_s = parse_rate(t.link);
    if (fit) {
      std::printf("%s\n", fit_costs(bench::read_csv(argv[1]), t, launch).c_str());
      return 0;
    }
    for (auto& r : bench::read_csv(argv[1])) {
      if (r.ranks != t.ranks()) continue;
      auto [it, fresh] = cells[r.op][r.bytes].try_emplace(r.system + "-" + r.transport, r);
      if (!fresh && r.median_us < it->second.median_us) it->second = r;  // the lower median
    }
    for (bench::op_kind op : bench::every_op()) print_table(bench::op_name(op), t);
    print_legend(t);
    print_model(t);
    print_targets(t);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "bench_hosts_report: %s\nusage: bench_hosts_report hosts.csv --hosts H "
                 "--ranks-per-host R --link RATE|none [--cpus-per-host C] [--link-costs TEXT]\n"
                 "                          [--chosen-with TEXT]\n"
                 "       bench_hosts_report calibration.csv --fit --hosts H ... "
                 "[--fit-launch hosts.csv]\n",
                 e.what());
    return 2;
  }
}
