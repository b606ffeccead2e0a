#pragma once
// cost_model — what moving bytes costs between two ranks, by the class of
// link between them, and what each algorithm therefore costs: the
// latency-bandwidth (alpha-beta) model, with the hosts' CPUs shared where
// they run more ranks than they have CPUs. algorithms/select.cpp runs the
// algorithm it predicts fastest; testing::predict asks the same of any
// layout of hosts and ranks, at any scale, without running anything.
//
// A message of m bytes on a link costs latency + m / bandwidth. Where k
// messages leave a host at once over its link, each gets a k-th of the
// link's bandwidth. The defaults are measured on the machines troupe is
// developed on (TCP between network namespaces for "other host", a CPU for
// each rank); TROUPE_LINK_COSTS overrides them:
//   TROUPE_LINK_COSTS="host=50us:1.25GB/s,local=5us:5GB/s,cpu=2GB/s,ranks_per_cpu=2,shared_wait=1.5"
// (host: between hosts; local: between processes of a host; units s, ms,
// us, ns and B/s, KB/s, MB/s, GB/s, or Gbit/s, Mbit/s; cpu: what a rank's
// CPU sends or receives over TCP, cpu_rate below; cpu_send: the sender's
// share of that work, a number, send_share below; cpu_cached, cpu_send_cached
// and cache: the same for calls that fit the cache (B, KiB, MiB, GiB), local_cached the
// local link's bandwidth for them; burst: a size, the
// bytes a shaped link passes at once, below; ranks_per_cpu and
// shared_wait and wait_share: plain numbers, hop_wait a time, below).
// bench/hosts_bench.sh --calibrate measures host, cpu, cpu_cached,
// cpu_send, cpu_send_cached, local, local_cached, hop_wait and wait_share
// first; the item
// `measure` has a world
// across hosts measure them at start (api/link_measurement.cpp, fitted by
// cost_fit.hpp), the items beside it winning over what it measures.
//
// Ranks that share a CPU (more ranks on a host than it has CPUs) wait for
// each other: a message between hosts wakes a reader thread and then its
// rank on a CPU that runs other ranks too. Measured across emulated hosts
// (veth, one rank per CPU to four), a barrier's round across hosts took
// 13 us at one rank per CPU, 45-62 at two, 83-146 at three, 169-209 at
// four; whole collectives fit k^2.3 times the latencies at k ranks per CPU
// better, their hops within a host waiting as long for the CPU as those
// between hosts. How long the wait is depends on the machine's scheduler
// and CPUs (an Intel Xeon's barriers fit k^1.0-1.2 at k = 2, k^1.8 at 4),
// hence shared_wait. Where the ranks that wait poll the CPU the receiver
// needs, a hop waits even where it alone receives: measured on 2 emulated
// hosts x 2 ranks sharing a CPU each, a small allreduce through the hosts'
// leaders (3 hops) took 55 us and the barrier (2 rounds) 60; on 4 x 2
// sharing 2 CPUs, 371 us (4 hops) and 368 (3 rounds), while the direct
// allreduce's 12 messages per host took 484: hence hop_wait, each hop's
// wait, and a message's work k times as long where k ranks share its CPU.
// The ranks working in a step share their host's CPUs for the bytes they
// move (cost_steps.hpp, cpu_share).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/topology.hpp"
#include "base/call.hpp"

namespace troupe::detail {

struct link_cost {
  double latency;    ///< seconds per message
  double bandwidth;  ///< bytes per second
  /// Seconds each further message a rank sends in the same step adds (the
  /// sending and receiving processes' work per message; between hosts
  /// TROUPE_LINK_COSTS's overhead=TIME, which bench/hosts_bench.sh fits
  /// from a pairwise alltoall of its layout).
  double overhead = 0;
  double time(double bytes) const { return latency + bytes / bandwidth; }
};

struct cost_model {
  link_cost local{5e-6, 5e9, 1e-6};   ///< between ranks of one host
  link_cost host{12e-6, 4e9, 10e-6};  ///< between hosts
  /// The ranks each CPU of the busiest host runs, where they outnumber its
  /// CPUs (1: a CPU for each rank, the default). The ranks that work in a
  /// step share their host's CPUs (ranks / ranks_per_cpu of them: a
  /// leader whose host's other ranks wait has a CPU of its own).
  double ranks_per_cpu = 1;
  /// Where ranks share CPUs, the CPU a rank that waits in a step takes, as
  /// a share of a working rank's (it polls, yielding, before it sleeps:
  /// cost_steps.hpp, cpu_share). 0.5 (the default) was measured on a kernel
  /// whose sched_yield gave the CPU back to the poller soon; on one whose
  /// poller yields to the working rank, measured between 2 emulated hosts x
  /// 2 ranks sharing a CPU each, a 16 MiB one-way transfer took what it
  /// takes at a CPU each. bench/hosts_bench.sh --calibrate fits it
  /// (wait_share) from a ping-pong between two hosts of the layout.
  double wait_share = 0.5;
  /// The setting named ranks_per_cpu (else a world across hosts sets what
  /// its ranks found: with_sharing).
  bool ranks_per_cpu_given = false;
  /// How much longer ranks that share CPUs wait: ranks_per_cpu^shared_wait
  /// times each latency (measured on the machines troupe is developed on,
  /// 2.3: see above; where hop_wait is measured, 0).
  double shared_wait = 2.3;
  /// What each message's receiver waits for its CPU where ranks share CPUs
  /// (ranks_per_cpu > 1), on top of its link's latency, however few of the
  /// step's ranks receive: the others poll their CPU meanwhile. Negative
  /// (the default): (ranks_per_cpu^shared_wait - 1) host latencies.
  /// bench/hosts_bench.sh --calibrate and a world's `measure` fit it to a
  /// barrier of the layout, shared_wait then 0 (cost_fit.hpp,
  /// fit_sharing).
  double hop_wait = -1;
  /// Bytes per second a rank's CPU sends or receives between hosts (TCP's
  /// copies and protocol; what bounds an unshaped link: measured at one
  /// rank per CPU over veth, a 16 MiB broadcast 3.3 GB/s, an exchange
  /// 2 GB/s each way).
  double cpu_rate = 4e9;
  /// The rate at which a rank's CPU moves the bytes of a call of at most
  /// `cache` bytes, which stay in its cache (0: cpu_rate; measured over
  /// veth between two hosts of a rank each, an exchange of 1 MiB each way
  /// 2.6 times as fast per byte as one of 16 MiB; bench/hosts_bench.sh
  /// --calibrate measures it from a 1 MiB allreduce).
  double cpu_cached_rate = 0;
  /// The share of a transfer's CPU work between hosts that falls on its
  /// sender (the receiver's: 1 - send_share), a rank's exchange (as much
  /// sent as received) costing 2 / cpu_rate per byte whatever the share.
  /// 0.5 (the default): as much on either side. Over veth the sender's CPU
  /// also runs the receiving side's protocol (the kernel delivers the bytes
  /// on it): measured between two emulated hosts of a rank each, a one-way
  /// 16 MiB transfer took 0.74 of an exchange of 16 MiB each way, a 1 MiB
  /// one 0.95 (bench/hosts_bench.sh --calibrate fits both from its
  /// ping-pongs: cpu_send, cpu_send_cached).
  double send_share = 0.5;
  /// send_share for a call of at most `cache` bytes (negative: send_share).
  double send_share_cached = -1;
  /// The CPU seconds a transfer of `bytes` between hosts costs its sender
  /// and its receiver (together 2 * bytes / cpu_rate).
  double sending(double bytes) const { return 2 * send_share * bytes / cpu_rate; }
  double receiving(double bytes) const { return 2 * (1 - send_share) * bytes / cpu_rate; }
  /// The local link's bandwidth for a call of at most `cache` bytes (0:
  /// local.bandwidth for every call): between processes of a host the
  /// bytes go through shared-memory rings, copied in and out, at the
  /// speed of memory where the cache holds them and of DRAM where not
  /// (measured with 2 ranks of a host on the message engine, a 1 MiB
  /// broadcast 15 GB/s, a 16 MiB one 9; bench/hosts_bench.sh --calibrate
  /// measures both from allreduces).
  double local_cached_rate = 0;
  /// The largest call whose bytes the CPUs move at cpu_cached_rate (a
  /// core's L2 cache on the machines troupe is developed on). The same on
  /// every rank (a setting, never read from the machine), as the choice
  /// must be.
  double cache = 4 << 20;
  /// Bytes a host's link passes at once, at no rate: a link shaped by a
  /// token bucket (tc's tbf, as the emulated hosts' links, whose bucket
  /// holds 1 ms at the rate) refills while a call waits for latencies and
  /// CPUs, so the call takes the longest of its link's bytes at the rate,
  /// the rest of its price with the link unbounded, and its whole price
  /// less a bucket's worth (measured on 2 x 2 at 1 Gbit/s, 64 KiB: an
  /// allgather 260 us where its bytes take 262 at the rate and its price
  /// with them serialised is 397). 0 (the default): the link serialises
  /// every byte, as a NIC at line rate.
  double burst = 0;
  /// This model with nothing but its link between hosts costing time (its
  /// bytes at the host bandwidth), and with that link unbounded: what a
  /// token bucket's call (burst) takes the longer of.
  cost_model link_alone() const;
  cost_model link_unbounded() const;
  /// This model for a call of `bytes`: cpu_rate at cpu_cached_rate (the
  /// local bandwidth at local_cached_rate, send_share at
  /// send_share_cached) where the call fits the cache and that term is
  /// set.
  cost_model of_call(double bytes) const;
  /// on_shared_cpus() made this model (its latencies already shared).
  bool latencies_shared = false;
  /// How long a rank waits for its turn on a CPU that another rank of the
  /// step holds ((k^shared_wait - 1) host latencies; on_shared_cpus() sets
  /// it, 0 where ranks have a CPU each): a step whose receiving ranks
  /// outnumber their host's CPUs takes one such turn more per rank a CPU
  /// serves in turn (cost_steps.hpp).
  double cpu_turn = 0;
  /// TROUPE_LINK_COSTS said `measure`: a world across hosts measures the
  /// link between them at start and its groups choose by that.
  bool measure = false;
  /// This model's latencies as ranks sharing CPUs see them (ranks_per_cpu
  /// = k > 1, w = k^shared_wait): a message, between hosts or within one,
  /// waits hop_wait for its receiver's CPU (unset: (w - 1) host latencies,
  /// so that one between hosts takes w times as long), a further receiver
  /// of a step its turn (cpu_turn), each further message's work k times as
  /// long (its CPU runs k ranks); itself at k = 1 or once applied. Every
  /// prediction applies it.
  cost_model on_shared_cpus() const;
  /// The process's model: the defaults, or TROUPE_LINK_COSTS (read once;
  /// a malformed value throws errc::invalid_argument naming it).
  static const cost_model& of_process();
  /// Parses TROUPE_LINK_COSTS's syntax over `base` (the defaults).
  static cost_model parse(const std::string& text, const cost_model& base);
  static cost_model parse(const std::string& text) { return parse(text, cost_model{}); }
  /// This model with ranks_per_cpu = `found` where the setting named none
  /// and `found` > 1: the ranks of a job across hosts find how many share
  /// each CPU of the busiest host (data_plane::job_sharing), so that its
  /// groups price the waits for the CPUs.
  cost_model with_sharing(double found) const;
  /// This model in TROUPE_LINK_COSTS's syntax (parse() reads it back).
  std::string to_text() const;
  /// The model a world measured (`text` as to_text() wrote it), shared by a
  /// group's topology; null where nothing was measured (empty).
  static std::shared_ptr<const cost_model> of_measured(const std::string& text);
};

/// How many slices the striped hierarchical allreduce of `bytes` runs at
/// once, each its own hierarchy (a slice crosses between hosts while the
/// next is reduced within its host): one per TROUPE_HIER_SEGMENT bytes (0:
/// one slice), at most 16, one below two slices' worth. Without the
/// setting, 4 MiB slices where `m`'s link between hosts is at most an
/// eighth of the bandwidth within one (a slow network: measured on 1 Gbit/s
/// links, 64 MiB 618 -> 601 ms), else one: where the hosts' CPUs are the
/// limit, slices only cost (unshaped veth, 64 MiB: 101-111 ms whole,
/// 129-143 ms in 4 MiB slices, 114 ms in 16 MiB ones).
int hier_segments(std::uint64_t bytes, const cost_model& m);

/// How many segments broadcast_chain cuts `bytes` into among `ranks`: a
/// quarter of a segment per rank of the chain's fill at most (the first
/// segment passes ranks - 1 hops before the last rank has any), between
/// 64 KiB and 1 MiB each.
int chain_segments(std::uint64_t bytes, int ranks);

/// The algorithms select.cpp chooses among, by collective.
enum class algorithm_kind : std::uint8_t {
  allreduce_direct,
  allreduce_pair,
  allreduce_halves,
  allreduce_ring,
  allreduce_recursive_doubling,
  allreduce_rabenseifner,
  allreduce_hier_striped,
  allreduce_hier_leaders,
  broadcast_binomial,
  broadcast_scatter_allgather,
  broadcast_hier,
  broadcast_chain,
  broadcast_chain_leaders,
  allgather_ring,
  allgather_bruck,
  allgather_recursive_doubling,
  allgather_hier_striped,
  allgather_hier_leaders,
  reduce_binomial,
  reduce_hier,
  reduce_chain,
  reduce_chain_leaders,
  alltoall_pairwise,
  alltoall_bruck,
  reduce_scatter_ring,
  reduce_scatter_halving,
  reduce_scatter_hier_striped,
  reduce_scatter_hier_leaders,
  other,  ///< the collective's one algorithm
};
const char* to_string(algorithm_kind k) noexcept;

/// Whether `kind` can run on `t` (the hierarchies: hosts of several ranks,
/// the striped ones as many on each; direct: at most 16 ranks; recursive
/// doubling's allgather: a power of two): what choose() prices, and a
/// forced algorithm that cannot run yields to it.
bool runs_on(algorithm_kind kind, const group_topology& t);

/// Predicted seconds of `kind` for a call of `bytes` (an allreduce's buffer,
/// a broadcast's or reduce's buffer, an allgather's output, what one rank
/// of an alltoall sends, in even splits, a reduce_scatter's whole input) on
/// `t`; `root`:
/// a broadcast's or reduce's (its trees cross between hosts where it puts
/// them).
double predict(algorithm_kind kind, std::uint64_t bytes, const group_topology& t,
               const cost_model& m, int root = 0);
/// The fastest algorithm for `code` over `bytes` on `t` (the same answer on
/// every rank that asks with the same arguments), and its predicted time.
struct choice {
  algorithm_kind kind;
  double seconds;
};
choice choose(op_code code, std::uint64_t bytes, const group_topology& t, const cost_model& m,
              int root = 0);

/// The collectives select.cpp does not choose for (gather, scatter,
/// barrier) run one algorithm each: its name and predicted seconds for
/// `bytes` (gather and scatter: the root's whole buffer; barrier: none) with
/// the root, where there is one, rank 0.
struct fixed_prediction {
  const char* algorithm;
  double seconds;
};
fixed_prediction predict_fixed(op_code code, std::uint64_t bytes, const group_topology& t,
                               const cost_model& m);

/// A send of `bytes` from rank `from` to rank `to` of `t` while every other
/// rank waits (a ping-pong's one-way time): one step, the link's bucket
/// (burst) as a collective's.
double send_time(std::uint64_t bytes, const group_topology& t, const cost_model& m, int from,
                 int to);

/// What the agreement (base/agreement.hpp) takes beside the algorithm of a
/// call whose result does not wait for every rank's data (broadcast,
/// reduce, gather, scatter): its rounds of dissemination where it rides the
/// data, else every rank telling every peer at once; 0 for the others (the
/// fingerprints ride on the data every rank waits for).
double agreement_time(op_code code, const group_topology& t, const cost_model& m);

/// What select.cpp runs for `code` over `bytes` on `t`: the algorithm
/// TROUPE_ALGORITHMS forces where it can run there, else choose()'s.
algorithm_kind chosen_algorithm(op_code code, std::uint64_t bytes, const group_topology& t,
                                const cost_model& m, int root = 0);
/// What troupe's message engine runs for `code` over `bytes` on `t` and its
/// predicted seconds: chosen_algorithm()'s where select.cpp chooses, else
/// the collective's one algorithm (predict_fixed), the call ending once
/// that and the agreement beside it (agreement_time) are done (the two
/// overlapping less where ranks share CPUs); one rank runs nothing.
/// `chosen_with` (null: `m`): the model the ranks choose by, where that is
/// not the one the time is priced with.
fixed_prediction predict_call(op_code code, std::uint64_t bytes, const group_topology& t,
                              const cost_model& m, const cost_model* chosen_with = nullptr);

}  // namespace troupe::detail
