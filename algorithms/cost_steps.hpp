#pragma once
// cost_steps — what one step of an algorithm costs under the cost model
// (cost_model.hpp): a step's time is its slowest host's, a transfer over a
// host's link sharing it with every other transfer leaving that host in the
// same step, each rank's CPU paying for the bytes it moves (shared where a
// host's ranks outnumber its CPUs). The algorithms' prices
// (algorithm_costs.cpp) are sums of such steps.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <vector>

#include "algorithms/cost_model.hpp"

namespace troupe::detail::cost {

/// The share of a CPU each of `busy` ranks of a host of `ranks` gets, its
/// CPUs shared by m.ranks_per_cpu ranks each (1: a CPU each). A rank that
/// waits meanwhile still takes some of its CPU (it polls, yielding, before
/// it sleeps): m.wait_share of a working rank's share.
double cpu_share(const cost_model& m, double ranks, double busy);

/// `m` as `busy` ranks of a host of `ranks` see it: its CPU rates (between
/// hosts, and the copies within one) at their share of the host's CPUs.
cost_model busy_ranks(const cost_model& m, double ranks, double busy);

/// What `receivers` ranks of a host of `ranks` that receive at once add
/// taking their turns on its CPUs (m.ranks_per_cpu ranks each): m.cpu_turn
/// for each rank a CPU serves after its first.
inline double cpu_turns(const cost_model& m, double ranks, int receivers) {
  const double cpus = std::max(1.0, std::floor(ranks / m.ranks_per_cpu));
  return std::max(0.0, std::ceil(receivers / cpus) - 1) * m.cpu_turn;
}

/// The bytes per second each rank reduces (or copies) where every rank of
/// `t` does at once.
double reducing(const group_topology& t, const cost_model& m);

/// A flat algorithm's step: every rank r sends `bytes(r)` to `to(r)` (or
/// nothing: -1). Its time is the slowest host's: the latency of its link
/// (between hosts where a transfer crosses; a rank's further messages in
/// one step, each its overhead, are the algorithms' to add: each rank here
/// sends one, and its host's ranks send theirs side by side — at 4 ranks
/// per CPU, a barrier's round of 2 messages leaving each host took what a
/// hop of one did, a pairwise alltoall's 14 six times as long), then the
/// longer of its link's wire time (full duplex: what
/// leaves and what arrives each have the bandwidth) and its busiest rank's
/// CPU time (the bytes it sends and receives between hosts at cpu_rate, the
/// sender's and the receiver's shares of that work as m.send_share says; the
/// bytes it receives within the host at the local bandwidth: a step's
/// copies run one after another on the rank's CPU). Where a host's
/// receiving ranks outnumber its CPUs (m.ranks_per_cpu > 1), they take
/// their turns: m.cpu_turn more for each rank a CPU serves after its first
/// (measured on 2 x 2 at 2 ranks per CPU: a ring's step, both ranks of a
/// host receiving, 31 us; an allreduce's hop between hosts' leaders 20).
template <class To, class Bytes>
double step_time(const group_topology& t, const cost_model& m, const To& to, const Bytes& bytes) {
  const int n = t.size();
  const auto hosts = static_cast<std::size_t>(std::max(t.hosts(), 1));
  std::vector<double> out(hosts, 0), in(hosts, 0), cpu(static_cast<std::size_t>(n), 0);
  std::vector<int> receivers(hosts, 0);
  // Which ranks receive, where CPU turns are priced (ranks sharing CPUs).
  std::vector<char> receives(m.cpu_turn > 0 ? static_cast<std::size_t>(n) : 0, 0);
  std::vector<char> crossed(hosts, 0), active(hosts, 0);
  auto host = [&](int r) {
    return t.hosts() > 0 ? static_cast<std::size_t>(t.host_of[static_cast<std::size_t>(r)])
                         : std::size_t{0};
  };
  for (int r = 0; r < n; ++r) {
    const int d = to(r);
    if (d < 0 || d == r) continue;
    const double b = bytes(r);
    const auto h = host(r), g = host(d);
    active[h] = active[g] = 1;
    if (!receives.empty() && !receives[static_cast<std::size_t>(d)]) {
      receives[static_cast<std::size_t>(d)] = 1;
      ++receivers[g];
    }
    if (h == g) {
      cpu[static_cast<std::size_t>(d)] += b / m.local.bandwidth;
    } else {
      out[h] += b;
      in[g] += b;
      crossed[h] = crossed[g] = 1;
      cpu[static_cast<std::size_t>(r)] += m.sending(b);
      cpu[static_cast<std::size_t>(d)] += m.receiving(b);
    }
  }
  std::vector<double> busiest(hosts, 0);
  std::vector<int> busy(hosts, 0);
  for (int r = 0; r < n; ++r) {
    const double c = cpu[static_cast<std::size_t>(r)];
    busiest[host(r)] = std::max(busiest[host(r)], c);
    busy[host(r)] += c > 0;
  }
  if (m.ranks_per_cpu > 1)  // the busy ranks share the host's CPUs
    for (std::size_t h = 0; h < hosts; ++h) {
      const auto ranks = t.hosts() > 0 ? t.ranks_on[h].size() : static_cast<std::size_t>(n);
      if (busy[h] > 0) busiest[h] /= cpu_share(m, static_cast<double>(ranks), busy[h]);
    }
  double worst = 0;
  for (std::size_t h = 0; h < hosts; ++h) {
    if (!active[h]) continue;
    const double wire = crossed[h] ? std::max(out[h], in[h]) / m.host.bandwidth : 0;
    double start = crossed[h] ? m.host.latency : m.local.latency;
    if (receivers[h] > 1)
      start +=
          cpu_turns(m, static_cast<double>(t.hosts() > 0 ? t.ranks_on[h].size() : n), receivers[h]);
    worst = std::max(worst, start + std::max(wire, busiest[h]));
  }
  return worst;
}

/// Two ranks on different hosts exchanging `bytes` each way: the link
/// carries them each way at once; each rank's CPU share moves both.
double exchange_between_hosts(const cost_model& m, double bytes);

/// One step of a ring ordered by host (rank order on one host): every rank
/// sends `block` bytes to its next.
double ring_step(const group_topology& t, const cost_model& m, double block);

/// `hosts` ranks, one on each host.
std::shared_ptr<const group_topology> one_rank_each(int hosts);

}  // namespace troupe::detail::cost
