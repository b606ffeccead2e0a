// cost_steps (cost_steps.hpp): the CPU shares and the steps every
// algorithm's price is made of.

#include "algorithms/cost_steps.hpp"

#include <string>

namespace troupe::detail::cost {

/// The share of a CPU each of `busy` ranks of a host of `ranks` gets, its
/// CPUs shared by m.ranks_per_cpu ranks each (1: a CPU each). A rank that
/// waits meanwhile still takes some of its CPU (it polls, yielding, before
/// it sleeps): m.wait_share of a working rank's share.
double cpu_share(const cost_model& m, double ranks, double busy) {
  if (!(m.ranks_per_cpu > 1)) return 1.0;
  busy = std::max(busy, 1.0);
  const double cpus = ranks / m.ranks_per_cpu;
  return std::min(1.0, cpus / (busy + m.wait_share * std::max(ranks - busy, 0.0)));
}

/// `m` as `busy` ranks of a host of `ranks` see it: its CPU rates (between
/// hosts, and the copies within one) at their share of the host's CPUs.
cost_model busy_ranks(const cost_model& m, double ranks, double busy) {
  const double share = cpu_share(m, ranks, busy);
  cost_model b = m;
  b.cpu_rate *= share;
  b.local.bandwidth *= share;
  b.ranks_per_cpu = 1;  // shared already
  return b;
}

/// The bytes per second each rank reduces (or copies) where every rank of
/// `t` does at once.
double reducing(const group_topology& t, const cost_model& m) {
  return m.local.bandwidth * cpu_share(m, t.most_on_a_host(), t.most_on_a_host());
}

/// Two ranks on different hosts exchanging `bytes` each way: the link
/// carries them each way at once; each rank's CPU share moves both.
double exchange_between_hosts(const cost_model& m, double bytes) {
  return m.host.latency +
         std::max(bytes / m.host.bandwidth, 2 * bytes / (m.cpu_rate * cpu_share(m, 1, 1)));
}

/// One step of a ring ordered by host (rank order on one host): every rank
/// sends `block` bytes to its next.
double ring_step(const group_topology& t, const cost_model& m, double block) {
  const int n = t.size();
  const auto order = t.hosts() > 1 ? t.host_order() : std::vector<int>{};
  std::vector<int> next(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p) {
    const int r = order.empty() ? p : order[static_cast<std::size_t>(p)];
    next[static_cast<std::size_t>(r)] =
        order.empty() ? (p + 1) % n : order[static_cast<std::size_t>((p + 1) % n)];
  }
  return step_time(
      t, m, [&](int r) { return next[static_cast<std::size_t>(r)]; }, [&](int) { return block; });
}

/// `hosts` ranks, one on each host.
std::shared_ptr<const group_topology> one_rank_each(int hosts) {
  std::vector<std::string> names;
  for (int h = 0; h < hosts; ++h) names.push_back(std::to_string(h));
  return group_topology::of_hosts(names);
}

}  // namespace troupe::detail::cost
