// flat_costs (flat_costs.hpp): the flat algorithms' prices, step by step.

#include "algorithms/flat_costs.hpp"

#include "algorithms/algorithm.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace troupe::detail::cost {
namespace {

/// The virtual ranks of recursive doubling and Rabenseifner's algorithm:
/// p, the largest power of two <= n; the first 2·extra ranks pair up and
/// the even one of each pair stands for both.
struct folded_ranks {
  int p = 1, extra = 0;
  explicit folded_ranks(int n) {
    while (p * 2 <= n) p *= 2;
    extra = n - p;
  }
  bool folded(int r) const { return r < 2 * extra && r % 2 == 1; }
  /// Rank r's partner across `mask` of the virtual ranks (-1: r is folded).
  int partner(int r, int mask) const {
    if (folded(r)) return -1;
    const int v = (r < 2 * extra ? r / 2 : r - extra) ^ mask;
    return v < extra ? 2 * v : v + extra;
  }
  /// The fold and the unfold of `bytes` (0 when n is a power of two).
  double fold_time(const group_topology& t, const cost_model& m, double bytes) const {
    if (extra == 0) return 0;
    return 2 * step_time(
                   t, m, [&](int r) { return folded(r) ? r - 1 : -1; }, [&](int) { return bytes; });
  }
};

}  // namespace

double ring_allreduce(const group_topology& t, const cost_model& m, double bytes) {
  const int n = t.size();
  return n < 2 ? 0 : 2.0 * (n - 1) * ring_step(t, m, bytes / n);
}

double recursive_doubling(const group_topology& t, const cost_model& m, double bytes) {
  if (t.size() < 2) return 0;
  const folded_ranks f{t.size()};
  double total = f.fold_time(t, m, bytes);
  for (int mask = 1; mask < f.p; mask <<= 1)
    total += step_time(
        t, m, [&](int r) { return f.partner(r, mask); }, [&](int) { return bytes; });
  return total;
}

double rabenseifner(const group_topology& t, const cost_model& m, double bytes) {
  if (t.size() < 2) return 0;
  const folded_ranks f{t.size()};
  double total = f.fold_time(t, m, bytes);
  for (int mask = f.p / 2; mask >= 1; mask /= 2) {
    const double part = bytes * mask / f.p;
    total += part / reducing(t, m) +
             2 * step_time(
                     t, m, [&](int r) { return f.partner(r, mask); }, [&](int) { return part; });
  }
  return total;
}

double ring_reduce_scatter(const group_topology& t, const cost_model& m, double bytes) {
  const int n = t.size();
  return n < 2 ? 0 : (n - 1) * std::max(ring_step(t, m, bytes / n), bytes / n / reducing(t, m));
}

double halving_reduce_scatter(const group_topology& t, const cost_model& m, double bytes) {
  const int n = t.size();
  if (n < 2) return 0;
  const folded_ranks f{n};
  double total = 0;
  if (f.extra > 0)
    total +=
        step_time(
            t, m, [&](int r) { return f.folded(r) ? r - 1 : -1; }, [&](int) { return bytes; }) +
        step_time(
            t, m, [&](int r) { return r < 2 * f.extra && !f.folded(r) ? r + 1 : -1; },
            [&](int) { return bytes / n; });
  for (int mask = f.p / 2; mask >= 1; mask /= 2) {
    const double part = bytes * mask / f.p;
    total += part / reducing(t, m) +
             step_time(
                 t, m, [&](int r) { return f.partner(r, mask); }, [&](int) { return part; });
  }
  return total;
}

double direct_allreduce(const group_topology& t, const cost_model& m, double bytes) {
  const int n = t.size();
  if (n < 2) return 0;
  // Every rank sends its buffer to every other: n-1 steps' worth of bytes at once.
  double worst = 0;
  for (int d = 1; d < n; ++d)
    worst += step_time(
        t, m, [&](int r) { return (r + d) % n; }, [&](int) { return bytes; });
  // One round of latency, not n-1; each further message the work of
  // sending and receiving it (overhead).
  const auto& link = t.hosts() > 1 ? m.host : m.local;
  return worst - (n - 2) * (link.latency - link.overhead);
}

double ring_allgather(const group_topology& t, const cost_model& m, double bytes) {
  const int n = t.size();
  return (n - 1) * ring_step(t, m, bytes / n);
}

double bruck_allgather(const group_topology& t, const cost_model& m, double bytes) {
  const int n = t.size();
  double total = bytes / m.local.bandwidth;
  for (int k = 1; k < n; k <<= 1)
    total += step_time(
        t, m, [&](int r) { return (r - k + n) % n; },
        [&](int) { return bytes / n * std::min(k, n - k); });
  return total;
}

double doubling_allgather(const group_topology& t, const cost_model& m, double bytes) {
  const int n = t.size();
  const ring_order order{t, n};
  double total = bytes / m.local.bandwidth;
  for (int k = 1; k < n; k <<= 1)
    total += step_time(
        t, m,
        [&](int r) {
          const int p = order.position(r);
          return order.shifted(r, (p ^ k) - p);
        },
        [&](int) { return bytes / n * k; });
  return total;
}

double binomial_broadcast(const group_topology& t, const cost_model& m, double bytes, int root) {
  const int n = t.size();
  double total = 0;
  for (int mask = 1; mask < n; mask <<= 1)
    total += step_time(
        t, m,
        [&](int r) {
          const int v = (r - root + n) % n;
          return v < mask && v + mask < n ? (v + mask + root) % n : -1;
        },
        [&](int) { return bytes; });
  return total;
}

double binomial_reduce(const group_topology& t, const cost_model& m, double bytes, int root) {
  const int n = t.size();
  double total = 0;
  for (int mask = 1; mask < n; mask <<= 1)
    total += bytes / reducing(t, m) +
             step_time(
                 t, m,
                 [&](int r) {
                   const int v = (r - root + n) % n;
                   return (v & (2 * mask - 1)) == mask ? (v - mask + root) % n : -1;
                 },
                 [&](int) { return bytes; });
  return total;
}

double scatter_allgather_broadcast(const group_topology& t, const cost_model& m, double bytes) {
  const int n = t.size();
  if (n < 2) return 0;
  int top = 1;
  while (top < n) top <<= 1;
  double total = 0;
  for (int mask = top >> 1; mask >= 1; mask >>= 1)
    total += step_time(
        t, m, [&](int r) { return r % (2 * mask) == 0 && r + mask < n ? r + mask : -1; },
        [&](int r) { return bytes * std::min(mask, n - r - mask) / n; });
  return total +
         (n - 1) * step_time(
                       t, m, [&](int r) { return (r + 1) % n; }, [&](int) { return bytes / n; });
}

namespace {

/// A chain's pipeline (broadcast_chain, reduce_chain) over chain_links(t,
/// n, root, through_leaders): its segments pass from each rank to its
/// children (toward the root where `to_root`), each rank also doing `work`
/// seconds per byte of a segment (a reduce's). The first segment's hops one
/// after another down the longest path (the fill: each a lone transfer,
/// within a host or across hosts), then a further segment each time the
/// busiest link or CPU, all of them busy, has moved one: the latencies and
/// the waits for the CPUs overlap the transfers then (measured on 4
/// emulated hosts x 2 ranks at 1 Gbit/s: 64 MiB's 64 segments took 590 ms
/// where their bytes take 565 at the link's rate; pricing each segment its
/// hop's latency and hop_wait on top gave 698). A rank with several
/// children copies each further one's segment into the local rings.
double chain_pipeline(const group_topology& t, const cost_model& m, double bytes, int root,
                      bool through_leaders, bool to_root, double work) {
  const int n = t.size();
  if (n < 2) return 0;
  const auto links = chain_links(t, n, root, through_leaders);
  auto parent = [&](int r) { return links.parent[static_cast<std::size_t>(r)]; };
  auto kids = [&](int r) { return links.children[static_cast<std::size_t>(r)].size(); };
  // Each rank's first child (its path's next hop), the way the bytes go.
  auto first = [&](int r) {
    const auto& c = links.children[static_cast<std::size_t>(r)];
    return c.empty() ? -1 : c.front();
  };
  auto to = [&](int r) { return to_root ? parent(r) : first(r); };
  const int segs = chain_segments(static_cast<std::uint64_t>(bytes), links.depth);
  const double segment = bytes / segs;
  // A rank's further children: toward them, each one more segment through
  // the rings; from them (their messages priced by the step), each one
  // more segment to reduce.
  double fan_out = 0;
  for (int r = 0; r < n; ++r)
    fan_out = std::max(fan_out,
                       std::max<double>(0, static_cast<double>(kids(r)) - 1) *
                           (segment * (to_root ? work : 1 / m.local.bandwidth) + m.local.overhead));
  // The fill: the hops of the longest path, from its deepest rank up, a
  // lone transfer each, priced once per kind (within a host, across hosts).
  auto same_host = [&](int a, int b) {
    return t.hosts() == 0 ||
           t.host_of[static_cast<std::size_t>(a)] == t.host_of[static_cast<std::size_t>(b)];
  };
  int hops[2] = {0, 0}, from[2] = {-1, -1}, dest[2] = {-1, -1};
  for (int q = links.deepest; parent(q) >= 0; q = parent(q)) {
    const int kind = same_host(q, parent(q)) ? 0 : 1;
    if (hops[kind]++ == 0) {
      from[kind] = to_root ? q : parent(q);
      dest[kind] = to_root ? parent(q) : q;
    }
  }
  double fill = fan_out;
  for (int kind : {0, 1})
    if (hops[kind] > 0)
      fill += hops[kind] *
              (segment * work + step_time(
                                    t, m, [&](int r) { return r == from[kind] ? dest[kind] : -1; },
                                    [&](int) { return segment; }));
  // Every rank at once, latencies and CPU turns hidden.
  cost_model busy = m;
  busy.host.latency = busy.local.latency = 0;
  busy.cpu_turn = 0;
  auto all = [&](const cost_model& x) { return step_time(t, x, to, [&](int) { return segment; }); };
  const double steady = std::max(all(busy), all(busy.link_unbounded()) + fan_out + segment * work);
  return fill + (segs - 1) * steady;
}

}  // namespace

double chain_broadcast(const group_topology& t, const cost_model& m, double bytes, int root,
                       bool through_leaders) {
  return chain_pipeline(t, m, bytes, root, through_leaders, false, 0);
}

double chain_reduce(const group_topology& t, const cost_model& m, double bytes, int root,
                    bool through_leaders) {
  return chain_pipeline(t, m, bytes, root, through_leaders, true, 1 / reducing(t, m));
}

double rooted_direct(const group_topology& t, const cost_model& m, double block, bool root_sends) {
  const int n = t.size();
  int local = 0, remote = 0;
  for (int r = 1; r < n; ++r)
    ++(t.host_of[static_cast<std::size_t>(r)] == t.host_of[0] ? local : remote);
  double worst = 0;
  if (local > 0)
    worst = m.local.latency + (local - 1) * m.local.overhead + local * block / m.local.bandwidth;
  if (remote > 0)
    worst = std::max(
        worst, m.host.latency + (remote - 1) * m.host.overhead +
                   std::max(remote * block / m.host.bandwidth,
                            root_sends ? m.sending(remote * block) : m.receiving(remote * block)));
  return worst;
}

double pairwise_alltoall(const group_topology& t, const cost_model& m, double bytes) {
  const int n = t.size();
  if (n < 2) return 0;
  const double block = bytes / n;
  double worst = 0;
  const int hosts = std::max(t.hosts(), 1);
  for (int h = 0; h < hosts; ++h) {
    const int k =
        t.hosts() > 0 ? static_cast<int>(t.ranks_on[static_cast<std::size_t>(h)].size()) : n;
    const int remote = n - k, local = k - 1;
    const double first = remote > 0 ? m.host.latency : m.local.latency;
    const double work = local * m.local.overhead + remote * m.host.overhead -
                        (remote > 0 ? m.host.overhead : m.local.overhead);
    const double wire =
        std::max({static_cast<double>(k) * remote * block / m.host.bandwidth,
                  2 * remote * block / m.cpu_rate,  // each rank's sends and receives
                  local * block / m.local.bandwidth});
    worst = std::max(worst, first + work + wire);
  }
  return worst;
}

double bruck_alltoall(const group_topology& t, const cost_model& m, double bytes) {
  const int n = t.size();
  if (n < 2) return 0;
  const double block = bytes / n;
  double total = 2 * bytes / m.local.bandwidth;  // the rotations
  for (int k = 1; k < n; k <<= 1) {
    const int moved = slots_with_bit(n, k);
    total += 2 * moved * block / m.local.bandwidth +  // pack and unpack
             step_time(
                 t, m, [&](int r) { return (r + k) % n; }, [&](int) { return moved * block; });
  }
  return total;
}

double dissemination(const group_topology& t, const cost_model& m) {
  const int n = t.size();
  double total = 0;
  for (int k = 1; k < n; k <<= 1)
    total += step_time(
        t, m, [&](int r) { return (r + k) % n; }, [](int) { return 0.0; });
  return total;
}

}  // namespace troupe::detail::cost
