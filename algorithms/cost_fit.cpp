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
  auto exchange = [&](double cpu, double bandwidth, int k) {
    cost_model x = m;
    x.cpu_rate = cpu;
    x.host.bandwidth = bandwidth;
    return cost::step_time(
        *t, x,
        [&](int r) {
          const int i = r % per;
          return i < k ? (r < per ? r + per : r - per) : -1;
        },
        [&](int) { return s.bytes; });
  };
  constexpr double unbounded = 1e15, lo = 1e5, hi = 1e13;
  const double bytes_at = s.bytes / (s.pair - s.one_way);  // the pair's rate each way
  if (s.pairs == 1) {
    // One pair: the time is the CPU's, unless the link as given is slower.
    m.host.bandwidth = std::max(base.host.bandwidth, bytes_at);
    m.cpu_rate = exchange(unbounded, m.host.bandwidth, 1) >= s.pair
                     ? base.cpu_rate
                     : solve_for([&](double c) { return exchange(c, m.host.bandwidth, 1); }, s.pair,
                                 lo, hi, true);
    return m;
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
  m.cpu_rate = exchange(unbounded, m.host.bandwidth, 1) >= s.pair * 0.98
                   ? std::max(cpu, base.cpu_rate)  // the link's time
                   : solve_for([&](double c) { return exchange(c, m.host.bandwidth, 1); }, s.pair,
                               lo, hi, true);
  return m;
}

cost_model fit_sharing(const cost_model& m, const group_topology& t, double seconds) {
  if (!(m.ranks_per_cpu > 1) || t.size() < 2) return m;
  cost_model x = m;
  x.shared_wait = 0;
  x.hop_wait = solve_for(
      [&](double hop) {
        cost_model y = x;
        y.hop_wait = hop;
        return predict_fixed(op_code::barrier, 0, t, y).seconds;
      },
      seconds, 0, 0.01, false);
  return x;
}

}  // namespace troupe::detail
