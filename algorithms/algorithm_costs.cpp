// algorithm_costs (cost_model.hpp): each algorithm's predicted time as a
// sum of its steps (cost_steps.hpp), and the choice among the algorithms of
// a collective.

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/cost_steps.hpp"
#include "base/agreement.hpp"

namespace troupe::detail {

using namespace cost;

namespace {

double ring_allreduce(const group_topology& t, const cost_model& m, double bytes) {
  const int n = t.size();
  return n < 2 ? 0 : 2.0 * (n - 1) * ring_step(t, m, bytes / n);
}

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

double recursive_doubling(const group_topology& t, const cost_model& m, double bytes) {
  if (t.size() < 2) return 0;
  const folded_ranks f{t.size()};
  double total = f.fold_time(t, m, bytes);
  for (int mask = 1; mask < f.p; mask <<= 1)
    total += step_time(
        t, m, [&](int r) { return f.partner(r, mask); }, [&](int) { return bytes; });
  return total;
}

/// Recursive halving then doubling over the virtual ranks of
/// recursive_doubling (the same fold and unfold): at halving step s each
/// rank sends the half of its range it gives up, bytes · mask / p with
/// mask = p >> (s+1); the doubling steps mirror them. Each halving step's
/// reduction waits for its whole message (the ring reduces one segment
/// while the next travels): it adds the bytes reduced at local memory speed.
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

/// The ring's reduce-scatter: n-1 steps of a block each; a step's segments
/// are reduced as they arrive while the next ones travel (measured on 2 x 2
/// unshaped, 64 MiB: 70 ms, the transfer's price 74, with the reductions
/// added 94), so a step takes the longer of the two.
double ring_reduce_scatter(const group_topology& t, const cost_model& m, double bytes) {
  const int n = t.size();
  return n < 2 ? 0 : (n - 1) * std::max(ring_step(t, m, bytes / n), bytes / n / reducing(t, m));
}

/// Rabenseifner's halving alone: the fold (the whole input), the halving
/// steps (each reduces what it receives), the unfold (one block).
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

/// `m` as one of `sharing` calls among one rank of each host sees it, all
/// crossing each host's links at once (of a host's `per_host` ranks: their
/// share of its CPUs; where they outnumber its CPUs, the ranks that receive
/// at once take turns on them, as step_time prices them).
cost_model sharing_links(const cost_model& m, int per_host, int sharing) {
  cost_model shared = busy_ranks(m, per_host, sharing);
  shared.host.bandwidth /= sharing;
  shared.host.latency += (sharing - 1) * m.host.overhead;
  shared.host.latency += cpu_turns(m, per_host, sharing);
  return shared;
}

/// The best flat allreduce among `hosts` ranks, one per host, each host's
/// link shared by `sharing` such allreduces at once (sharing_links).
double across_hosts(int hosts, int per_host, int sharing, const cost_model& m, double bytes) {
  if (hosts < 2) return 0;
  const auto t = one_rank_each(hosts);
  const cost_model shared = sharing_links(m, per_host, sharing);
  if (hosts == 2) return exchange_between_hosts(shared, bytes);  // one exchange (pair)
  return std::min({ring_allreduce(*t, shared, bytes), recursive_doubling(*t, shared, bytes),
                   rabenseifner(*t, shared, bytes),
                   hosts <= 16 ? direct_allreduce(*t, shared, bytes)
                               : std::numeric_limits<double>::infinity()});
}

double ring_allgather(const group_topology& t, const cost_model& m, double bytes) {
  const int n = t.size();
  return (n - 1) * ring_step(t, m, bytes / n);
}

/// Bruck's allgather: its slots are copied out in a rotation at the end.
double bruck_allgather(const group_topology& t, const cost_model& m, double bytes) {
  const int n = t.size();
  double total = bytes / m.local.bandwidth;
  for (int k = 1; k < n; k <<= 1)
    total += step_time(
        t, m, [&](int r) { return (r - k + n) % n; },
        [&](int) { return bytes / n * std::min(k, n - k); });
  return total;
}

/// Recursive doubling's allgather: places host by host, as the algorithm
/// takes them; step k to the place p ^ k with k blocks; the slots copied
/// out at the end.
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

/// Every rank sends `bytes` to each other rank of its host at once (hosts
/// of as many ranks each), in `messages` messages each: the first costs
/// the latency within a host, each further one the sender's work
/// (overhead); the steps' copies, and where ranks share CPUs their turns,
/// as step_time prices them.
double within_hosts(const group_topology& t, const cost_model& m, double bytes, int messages) {
  const int local = t.most_on_a_host();
  if (local < 2) return 0;
  double total = 0;
  for (int d = 1; d < local; ++d)
    total += step_time(
        t, m,
        [&](int r) {
          const auto& on =
              t.ranks_on[static_cast<std::size_t>(t.host_of[static_cast<std::size_t>(r)])];
          return on[static_cast<std::size_t>((t.local_index(r) + d) % local)];
        },
        [&](int) { return bytes; });
  return total - (local - 2) * (m.local.latency - m.local.overhead) +
         (local - 1) * (messages - 1) * m.local.overhead;
}

/// The best allgather (`gathers`) or reduce-scatter of `bytes` among
/// `hosts` ranks, one on each host, under `m`.
double among_hosts(bool gathers, int hosts, const cost_model& m, double bytes) {
  if (hosts < 2) return 0;
  const auto each = one_rank_each(hosts);
  if (!gathers)
    return std::min(ring_reduce_scatter(*each, m, bytes),
                    hosts > 2 ? halving_reduce_scatter(*each, m, bytes)
                              : std::numeric_limits<double>::infinity());
  double best = std::min(ring_allgather(*each, m, bytes), bruck_allgather(*each, m, bytes));
  if (hosts > 2 && power_of_two(hosts)) best = std::min(best, doubling_allgather(*each, m, bytes));
  return best;
}

/// allgather_hier or reduce_scatter_hier (`gathers`: which), striped, of
/// `bytes` in k slices (as the algorithms' files slice), a pipeline as the
/// striped allreduce's: the first slice's two stages, then the slower for
/// each further slice. Across: each column (a rank of each host) gathers or
/// reduce-scatters its blocks among the hosts, the host's columns sharing
/// its link. Within: each rank sends its host's other ranks a message a
/// block of their column, all of them receiving at once; allgather's ranks
/// copy their own column's blocks out, reduce_scatter's reduce theirs.
double striped_columns(bool gathers, const group_topology& t, const cost_model& m, double bytes,
                       int k) {
  const int per_host = t.most_on_a_host();
  const double column = bytes / per_host / k;
  const double across =
      among_hosts(gathers, t.hosts(), sharing_links(m, per_host, per_host), column);
  const double within = within_hosts(t, m, column, t.hosts()) +
                        (gathers ? column / busy_ranks(m, per_host, per_host).local.bandwidth
                                 : column * per_host / reducing(t, m));
  return across + within + (k - 1) * std::max(across, within);
}

/// allgather_hier or reduce_scatter_hier (`gathers`: which) through each
/// host's first rank, of `bytes` (the output, the input): each host's
/// ranks send it their blocks (their inputs), which it places (reduces);
/// the leaders gather (reduce-scatter) the hosts' parts among them (one
/// per host, the others waiting: `leader`); each leader copies the result
/// out and sends it (each rank its block) back.
double through_leaders(bool gathers, const group_topology& t, const cost_model& m,
                       const cost_model& leader, double bytes) {
  const int per_host = t.most_on_a_host();
  const double block = bytes / t.size();
  const double in = gathers ? block : bytes, out = gathers ? bytes : block;
  return leader.local.time(in * (per_host - 1)) + leader.local.time(out * (per_host - 1)) +
         2 * std::max(per_host - 2, 0) * m.local.overhead +
         (gathers ? bytes : bytes * (per_host + 1)) / leader.local.bandwidth +
         among_hosts(gathers, t.hosts(), leader, bytes);
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

/// reduce_binomial's tree to `root`: at each mask, the ranks whose
/// position v = rank - root has it as its lowest set bit send their sums to
/// v - mask, which reduces them.
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

/// The root's binomial scatter (the range a subtree needs, largest first),
/// then a ring allgather of one block per rank.
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

/// Rank 0 exchanging `block` bytes with every other rank at once (gather's
/// and scatter's direct algorithms: the root receives them or, where
/// `root_sends`, sends them): the root's links and CPU carry them all.
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

/// Every rank sends its block of bytes / n to every other at once: the
/// first message costs its link's latency, each further one the sender's
/// work per message (overhead); a host's link carries every block its
/// ranks send off the host. Priced per host (the choice is made at every
/// call on every rank: a price by rounds, O(n^2), took 40% of 2,048
/// in-process ranks' time).
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

/// Bruck's alltoall: ceil(log2 n) steps; at step k every rank sends the
/// blocks whose slot has bit k set (about half of them) to rank + k, packed,
/// and unpacks what rank - k sent; the blocks are rotated in before and out
/// after.
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

/// Rounds of dissemination: round k, every rank to rank + 2^k.
double dissemination(const group_topology& t, const cost_model& m) {
  const int n = t.size();
  double total = 0;
  for (int k = 1; k < n; k <<= 1)
    total += step_time(
        t, m, [&](int r) { return (r + k) % n; }, [](int) { return 0.0; });
  return total;
}

}  // namespace

double agreement_time(op_code code, const group_topology& t, const cost_model& base) {
  const int n = t.size();
  switch (code) {
    case op_code::broadcast:
    case op_code::reduce:
    case op_code::gatherv:
    case op_code::scatterv:
      break;
    default:  // every rank's result waits for every rank's data (or pairs meet)
      return 0;
  }
  if (n < 2) return 0;
  const cost_model m = base.on_shared_cpus();
  if (agreement_rides_data(n, t.messages_leave_process())) return dissemination(t, m);
  // Every rank tells every peer at once: one step, and a message's work
  // for each further peer.
  const link_cost& l = t.hosts() > 1 ? m.host : m.local;
  return step_time(
             t, m, [&](int r) { return (r + 1) % n; }, [](int) { return 0.0; }) +
         (n - 2) * l.overhead;
}

fixed_prediction predict_fixed(op_code code, std::uint64_t bytes_in, const group_topology& t,
                               const cost_model& base) {
  const double bytes = static_cast<double>(bytes_in);
  const cost_model m = base.on_shared_cpus().of_call(bytes);
  const int n = t.size();
  switch (code) {
    case op_code::gatherv:
      return {"gather_direct", rooted_direct(t, m, bytes / n, false)};
    case op_code::scatterv:
      return {"scatter_direct", rooted_direct(t, m, bytes / n, true)};
    case op_code::barrier:
    case op_code::monitored_barrier:
      return {"barrier_dissemination", dissemination(t, m)};
    default:
      return {"other", 0};
  }
}

namespace {

/// `kind`'s sum of steps under `base`, sliced as `slicing` slices it (the
/// model the call runs by, whatever `base` leaves out).
double priced(algorithm_kind kind, std::uint64_t bytes_in, const group_topology& t,
              const cost_model& base, int root, const cost_model& slicing) {
  const double bytes = static_cast<double>(bytes_in);
  const cost_model m = base.on_shared_cpus().of_call(bytes);
  const int hosts = t.hosts();
  const int per_host = t.most_on_a_host();
  // What one rank of each host (a leader, the others waiting) sees.
  const cost_model leader = busy_ranks(m, per_host, 1);
  auto pair = [&](double b) { return hosts > 1 ? exchange_between_hosts(m, b) : m.local.time(b); };
  switch (kind) {
    case algorithm_kind::allreduce_direct:
      return direct_allreduce(t, m, bytes);
    case algorithm_kind::allreduce_pair:
      return pair(bytes);
    case algorithm_kind::allreduce_halves:
      return 2 * pair(bytes / 2);
    case algorithm_kind::allreduce_ring:
      return ring_allreduce(t, m, bytes);
    case algorithm_kind::allreduce_recursive_doubling:
      return recursive_doubling(t, m, bytes);
    case algorithm_kind::allreduce_rabenseifner:
      return rabenseifner(t, m, bytes);
    case algorithm_kind::allreduce_hier_striped: {
      // Reduce-scatter and allgather within each host, and the hosts' part
      // allreduces, one per rank of a host, sharing the host's link; in k
      // slices at once, a pipeline: the first slice's three stages, then
      // the slowest stage for each further slice.
      const int k = hier_segments(bytes_in, slicing);  // as allreduce_hier.cpp slices
      const double slice = bytes / k;
      const double within =
          busy_ranks(m, per_host, per_host).local.time(slice * (per_host - 1) / per_host);
      const double across = across_hosts(hosts, per_host, per_host, m, slice / per_host);
      return 2 * within + across + (k - 1) * std::max(within, across);
    }
    case algorithm_kind::allreduce_hier_leaders:
      // Reduce to each host's first rank, allreduce among them, send back.
      // Only the leaders work while the others wait: a CPU each.
      return 2 * (leader.local.time(bytes * (per_host - 1)) + (per_host - 2) * m.local.overhead) +
             across_hosts(hosts, per_host, 1, m, bytes);
    case algorithm_kind::broadcast_binomial:
      return binomial_broadcast(t, m, bytes, root);
    case algorithm_kind::broadcast_scatter_allgather:
      return scatter_allgather_broadcast(t, m, bytes);
    case algorithm_kind::broadcast_hier: {
      const std::vector<std::string> one_host(static_cast<std::size_t>(per_host), "h");
      return binomial_broadcast(*one_rank_each(hosts), leader, bytes,
                                t.host_of[static_cast<std::size_t>(root)]) +
             binomial_broadcast(*group_topology::of_hosts(one_host), m, bytes, 0);
    }
    case algorithm_kind::allgather_ring:
      return ring_allgather(t, m, bytes);
    case algorithm_kind::allgather_bruck:
      return bruck_allgather(t, m, bytes);
    case algorithm_kind::allgather_recursive_doubling:
      return doubling_allgather(t, m, bytes);
    case algorithm_kind::allgather_hier_leaders:
    case algorithm_kind::reduce_scatter_hier_leaders:
      return through_leaders(kind == algorithm_kind::allgather_hier_leaders, t, m, leader, bytes);
    case algorithm_kind::allgather_hier_striped:
    case algorithm_kind::reduce_scatter_hier_striped:
      return striped_columns(kind == algorithm_kind::allgather_hier_striped, t, m, bytes,
                             hier_segments(bytes_in, slicing));
    case algorithm_kind::reduce_binomial:
      return binomial_reduce(t, m, bytes, root);
    case algorithm_kind::reduce_hier:
      // Each host's ranks to its leader, which reduces them; then the
      // leaders' binomial reduction, one per host.
      return leader.local.time(bytes * (per_host - 1)) +
             std::max(per_host - 2, 0) * m.local.overhead +
             bytes * per_host / leader.local.bandwidth +
             binomial_reduce(*one_rank_each(hosts), leader, bytes,
                             t.host_of[static_cast<std::size_t>(root)]);
    case algorithm_kind::alltoall_pairwise:
      return pairwise_alltoall(t, m, bytes);
    case algorithm_kind::alltoall_bruck:
      return bruck_alltoall(t, m, bytes);
    case algorithm_kind::reduce_scatter_ring:
      return ring_reduce_scatter(t, m, bytes);
    case algorithm_kind::reduce_scatter_halving:
      return halving_reduce_scatter(t, m, bytes);
    case algorithm_kind::other:
      return 0;
  }
  return 0;
}

}  // namespace

double predict(algorithm_kind kind, std::uint64_t bytes, const group_topology& t,
               const cost_model& m, int root) {
  const double whole = priced(kind, bytes, t, m, root, m);
  if (!(m.burst > 0) || t.hosts() < 2) return whole;
  // A token bucket on the link (cost_model::burst): it refills while the
  // call waits for the rest, and passes a bucket's worth at once.
  return std::max({priced(kind, bytes, t, m.link_alone(), root, m),
                   priced(kind, bytes, t, m.link_unbounded(), root, m),
                   whole - m.burst / m.host.bandwidth});
}

bool runs_on(algorithm_kind k, const group_topology& t) {
  const bool hosts = t.hosts() > 1 && t.most_on_a_host() > 1;
  switch (k) {
    case algorithm_kind::allreduce_hier_striped:
    case algorithm_kind::allgather_hier_striped:
    case algorithm_kind::reduce_scatter_hier_striped:
      return hosts && t.uniform();
    case algorithm_kind::allreduce_hier_leaders:
    case algorithm_kind::allgather_hier_leaders:
    case algorithm_kind::reduce_scatter_hier_leaders:
    case algorithm_kind::broadcast_hier:
    case algorithm_kind::reduce_hier:
      return hosts;
    case algorithm_kind::allreduce_direct:
      return t.size() <= 16;
    case algorithm_kind::allgather_recursive_doubling:
      return power_of_two(t.size());
    default:
      return true;
  }
}

choice choose(op_code code, std::uint64_t bytes, const group_topology& t, const cost_model& m,
              int root) {
  const int n = t.size();
  std::vector<algorithm_kind> candidates;
  switch (code) {
    case op_code::allreduce:
      if (n == 2) {
        // Two ranks: one exchange of the buffers up to 1 MiB; beyond, each
        // reduces a half (the receiving thread reduces while this one sends).
        const auto k = bytes > (std::uint64_t{1} << 20) ? algorithm_kind::allreduce_halves
                                                        : algorithm_kind::allreduce_pair;
        return {k, predict(k, bytes, t, m)};
      }
      candidates = {algorithm_kind::allreduce_ring, algorithm_kind::allreduce_recursive_doubling,
                    algorithm_kind::allreduce_rabenseifner};
      candidates.insert(candidates.end(),
                        {algorithm_kind::allreduce_direct, algorithm_kind::allreduce_hier_leaders,
                         algorithm_kind::allreduce_hier_striped});
      break;
    case op_code::broadcast:
      candidates = {algorithm_kind::broadcast_binomial};
      // Scatter-allgather's 2N bytes beat the tree's root sending N to each
      // of its log2(n) children from 8 ranks on; at 4 its n-1 dependent
      // ring steps lost at every size (measured on emulated hosts, 2 CPUs:
      // 1 MiB 2.75 ms tree, 3.02 ms scatter-allgather; 8 ranks 7.47, 5.98).
      if (n >= 8) candidates.push_back(algorithm_kind::broadcast_scatter_allgather);
      candidates.push_back(algorithm_kind::broadcast_hier);
      break;
    case op_code::allgatherv:
      candidates = {algorithm_kind::allgather_ring, algorithm_kind::allgather_bruck};
      if (n > 2) candidates.push_back(algorithm_kind::allgather_recursive_doubling);
      candidates.insert(candidates.end(), {algorithm_kind::allgather_hier_leaders,
                                           algorithm_kind::allgather_hier_striped});
      break;
    case op_code::reduce:
      candidates = {algorithm_kind::reduce_binomial, algorithm_kind::reduce_hier};
      break;
    case op_code::reduce_scatterv:
      candidates = {algorithm_kind::reduce_scatter_ring};
      if (n > 2) candidates.push_back(algorithm_kind::reduce_scatter_halving);
      candidates.insert(candidates.end(), {algorithm_kind::reduce_scatter_hier_leaders,
                                           algorithm_kind::reduce_scatter_hier_striped});
      break;
    case op_code::alltoallv:  // Bruck's steps: even splits only (alltoall_runs_bruck)
      candidates = {algorithm_kind::alltoall_pairwise};
      if (n > 2) candidates.push_back(algorithm_kind::alltoall_bruck);
      break;
    default:
      return {algorithm_kind::other, 0};
  }
  std::erase_if(candidates, [&](algorithm_kind k) { return !runs_on(k, t); });
  choice best{candidates.front(), std::numeric_limits<double>::infinity()};
  for (auto k : candidates)
    if (const double s = predict(k, bytes, t, m, root); s < best.seconds) best = {k, s};
  return best;
}

}  // namespace troupe::detail
