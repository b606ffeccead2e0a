#pragma once
// cost_fit — the cost model's terms from measured times: what a world across
// hosts measures at start (TROUPE_LINK_COSTS=measure, api/link_measurement.cpp)
// turned into the latency and bandwidth between hosts, the TCP rate of a
// rank's CPU, the work of each further message between hosts and, where
// ranks share CPUs, hop_wait. Each term is the value
// at which the model's own price of the measured exchange is the time
// measured, so the model then prices what it was fitted on as measured.

#include <cmath>

#include "algorithms/cost_model.hpp"

namespace troupe::detail {

/// What a world measured between its first two hosts (each of
/// `ranks_per_host` ranks; the others idle meanwhile).
struct link_sample {
  double one_way = 0;  ///< seconds: half a 4-byte round trip between them
  double bytes = 0;    ///< what a rank sent and received in an exchange
  double pair = 0;     ///< seconds: one rank of each host exchanging `bytes`
  /// Ranks of each host exchanging with their counterpart at once in `all`
  /// (1: `all` not measured).
  int pairs = 1;
  double all = 0;  ///< seconds: the `pairs` exchanges at once
  int ranks_per_host = 1;
  /// The same pair exchanging `cached_bytes` each way (at most the model's
  /// `cache`: the bytes its CPUs move at cpu_cached_rate), in `pair_cached`
  /// seconds (0: not measured).
  double cached_bytes = 0;
  double pair_cached = 0;
};

/// `base` (its local link, ranks_per_cpu and shared_wait kept) with the
/// host latency, the host bandwidth and the CPU rate fitted to `s`. Where
/// one term explains a time alone the other keeps base's value (a link
/// slower than the CPUs leaves the CPU rate unmeasured), and where only one
/// pair was measured the time is the CPU's (as bench_hosts_report --fit);
/// the cached rate from `pair_cached` where the link leaves it the time
/// (else unset: cpu_rate).
/// Throws errc::invalid_argument on a sample that is not positive.
cost_model fit_link(const cost_model& base, const link_sample& s);

/// What a world measured of its whole layout: a barrier, and every rank
/// sending each other rank `block` bytes at once (the pairwise alltoall's
/// one step; 0: not measured).
struct layout_sample {
  double barrier = 0;   ///< seconds
  double alltoall = 0;  ///< seconds (0: not measured)
  double block = 4;     ///< bytes each rank sends each other rank in `alltoall`
};

/// `m` with the terms of its hosts' waits fitted to `s` on `t`: where its
/// ranks share CPUs, hop_wait (0 to 10 ms) at which its barrier takes what
/// `s` measured, shared_wait 0 (no further turn for a step's further
/// receivers: fitted together with hop_wait from a barrier and a small
/// allreduce through the hosts' leaders across emulated hosts, it came out
/// 0 at 2 and at 4 ranks per CPU); where the alltoall was measured and `t`
/// spans hosts, the host link's overhead (0 to 10 ms) at which the pairwise
/// alltoall takes what it measured. The barrier's rounds send further
/// messages too and the alltoall waits its hops: the two are fitted in turn
/// until each prices what it measured. `m` itself where there is nothing to
/// fit.
cost_model fit_sharing(const cost_model& m, const group_topology& t, const layout_sample& s);

/// The x in [lo, hi] (searched geometrically where `geometric`) at which f,
/// rising or falling in x, meets `goal`; clamped to the ends.
template <class F>
double solve_for(F f, double goal, double lo, double hi, bool geometric) {
  const bool rising = f(hi) > f(lo);
  for (int i = 0; i < 60; ++i) {
    const double mid = geometric ? std::sqrt(lo * hi) : (lo + hi) / 2;
    ((f(mid) < goal) == rising ? lo : hi) = mid;
  }
  return geometric ? std::sqrt(lo * hi) : (lo + hi) / 2;
}

}  // namespace troupe::detail
