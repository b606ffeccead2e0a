// cost_fit (cost_fit.hpp): the link's terms from the exchanges a world
// measured at start, priced by the same steps the algorithms' prices use.

#include "algorithms/cost_fit.hpp"

#include <string>
#include <vector>

#include "algorithms/cost_steps.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

cost_model fit_link(const cost_model& base, const link_sample& s) {
  if (!(s.one_way > 0) || !(s.bytes > 0) || !(s.pair > s.one_way) || s.pairs < 1 ||
      s.ranks_per_host < s.pairs || (s.pairs > 1 && !(s.all > s.one_way)))
    throw error(errc::invalid_argument,
                "fit_link: a measurement is not positive (one way " + std::to_string(s.one_way) +
                    " s, exchange of " + std::to_string(s.bytes) + " bytes " +
                    std::to_string(s.pair) + " s, " + std::to_string(s.pairs) + " at once " +
                    std::to_string(s.all) + " s)");
  cost_model m = base;
  m.host.latency = s.one_way;
  // Two hosts of the sample's ranks; rank i of the first exchanges with
  // rank i of the second, the first `k` of each at once.
  std::vector<std::string> names;
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < s.ranks_per_host; ++i) names.push_back(std::to_string(h));
  const auto t = group_topology::of_hosts(names);
  const int per = s.ranks_per_host;
  // The model's time for `k` pairs exchanging `bytes` at once with the CPU
  // rate `cpu` and the link's `bandwidth`.
  auto exchange_of = [&](double bytes, double cpu, double bandwidth, int k) {
    cost_model x = m;
    x.cpu_rate = cpu;
    x.host.bandwidth = bandwidth;
    return cost::step_time(
        *t, x,
        [&](int r) {
          const int i = r % per;
          return i < k ? (r < per ? r + per : r - per) : -1;
        },
        [&](int) { return bytes; });
  };
  auto exchange = [&](double cpu, double bandwidth, int k) {
    return exchange_of(s.bytes, cpu, bandwidth, k);
  };
  constexpr double unbounded = 1e15, lo = 1e5, hi = 1e13;
  // The CPU rate at which one pair's exchange of `bytes` takes `seconds` on
  // the link as fitted; `otherwise` where the link alone takes `near` of
  // that long.
  auto cpu_for = [&](double bytes, double seconds, double otherwise, double near = 0.98) {
    auto priced = [&](double c) { return exchange_of(bytes, c, m.host.bandwidth, 1); };
    return priced(unbounded) >= seconds * near ? otherwise
                                               : solve_for(priced, seconds, lo, hi, true);
  };
  // Then the cached rate, where the pair's cached exchange was measured.
  auto with_cached = [&] {
    if (s.pair_cached > 0 && s.cached_bytes > 0 && s.cached_bytes <= m.cache)
      m.cpu_cached_rate = cpu_for(s.cached_bytes, s.pair_cached, base.cpu_cached_rate);
    return m;
  };
  const double bytes_at = s.bytes / (s.pair - s.one_way);  // the pair's rate each way
  if (s.pairs == 1) {
    // One pair: the time is the CPU's, unless the link as given is slower.
    m.host.bandwidth = std::max(base.host.bandwidth, bytes_at);
    m.cpu_rate = cpu_for(s.bytes, s.pair, base.cpu_rate, 1);
    return with_cached();
  }
  // The CPU from the pair as if the link had no bound, then the link from
  // the pairs at once; then the CPU again, bounded by that link.
  const double cpu =
      solve_for([&](double c) { return exchange(c, unbounded, 1); }, s.pair, lo, hi, true);
  const int k = s.pairs;
  m.host.bandwidth =
      exchange(cpu, unbounded, k) >= s.all * 0.98
          ? std::max(base.host.bandwidth, k * s.bytes / (s.all - s.one_way))  // the CPUs' time
          : solve_for([&](double b) { return exchange(cpu, b, k); }, s.all, lo, hi, true);
  m.host.bandwidth = std::max(m.host.bandwidth, bytes_at);
  m.cpu_rate = cpu_for(s.bytes, s.pair, std::max(cpu, base.cpu_rate));  // else the link's time
  return with_cached();
}

cost_model fit_sharing(const cost_model& m, const group_topology& t, const layout_sample& s) {
  const bool sharing = m.ranks_per_cpu > 1 && t.size() > 1;
  const bool overhead = s.alltoall > 0 && t.hosts() > 1;
  cost_model x = m;
  if (sharing) x.shared_wait = 0;
  // The barrier's hop_wait with `x`'s overhead, then the alltoall's
  // overhead with that hop_wait; once where only one is fitted.
  for (int round = 0; round < (sharing && overhead ? 12 : 1); ++round) {
    if (sharing)
      x.hop_wait = solve_for(
          [&](double hop) {
            cost_model y = x;
            y.hop_wait = hop;
            return predict_fixed(op_code::barrier, 0, t, y).seconds;
          },
          s.barrier, 0, 0.01, false);
    if (overhead)
      x.host.overhead = solve_for(
          [&](double o) {
            cost_model y = x;
            y.host.overhead = o;
            return predict(algorithm_kind::alltoall_pairwise,
                           static_cast<std::uint64_t>(s.block * t.size()), t, y);
          },
          s.alltoall, 0, 0.01, false);
  }
  return x;
}

}  // namespace troupe::detail
