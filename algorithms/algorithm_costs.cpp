// algorithm_costs (cost_model.hpp): each algorithm's predicted time (the
// flat ones' in flat_costs.hpp, the hierarchies' here, from theirs and
// cost_steps.hpp), the agreement's beside it, and the choice among the
// algorithms of a collective.

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/cost_steps.hpp"
#include "algorithms/flat_costs.hpp"
#include "base/agreement.hpp"

namespace troupe::detail {

using namespace cost;

namespace {

/// `m` as one of `sharing` calls among one rank of each host sees it, all
/// crossing each host's links at once (of a host's `per_host` ranks: their
/// share of its CPUs; where they outnumber its CPUs, the ranks that receive
/// at once take turns on them, as step_time prices them; each rank's
/// messages its own work, side by side with the others').
cost_model sharing_links(const cost_model& m, int per_host, int sharing) {
  cost_model shared = busy_ranks(m, per_host, sharing);
  shared.host.bandwidth /= sharing;
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

/// `price(model)` for a call of `bytes` on `t` under `m`, the link's token
/// bucket (cost_model::burst) priced: it refills while the call waits for
/// the rest, and passes a bucket's worth at once.
template <class Price>
double with_bucket(const group_topology& t, const cost_model& m, const Price& price) {
  const double whole = price(m);
  if (!(m.burst > 0) || t.hosts() < 2) return whole;
  return std::max(
      {price(m.link_alone()), price(m.link_unbounded()), whole - m.burst / m.host.bandwidth});
}

}  // namespace

double send_time(std::uint64_t bytes_in, const group_topology& t, const cost_model& base, int from,
                 int to) {
  const double bytes = static_cast<double>(bytes_in);
  return with_bucket(t, base, [&](const cost_model& priced) {
    const cost_model m = priced.on_shared_cpus().of_call(bytes);
    return step_time(
        t, m, [&](int r) { return r == from ? to : -1; }, [&](int) { return bytes; });
  });
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
      // the slowest stage for each further slice. Within a host each rank
      // sends each other a block: a message's work for each further one.
      const int k = hier_segments(bytes_in, slicing);  // as allreduce_hier.cpp slices
      const double slice = bytes / k;
      const double within =
          busy_ranks(m, per_host, per_host).local.time(slice * (per_host - 1) / per_host) +
          std::max(per_host - 2, 0) * m.local.overhead;
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
    case algorithm_kind::broadcast_chain:
      return chain_broadcast(t, m, bytes, root, false);
    case algorithm_kind::broadcast_chain_leaders:
      return chain_broadcast(t, m, bytes, root, true);
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
    case algorithm_kind::reduce_chain:
      return chain_reduce(t, m, bytes, root, false);
    case algorithm_kind::reduce_chain_leaders:
      return chain_reduce(t, m, bytes, root, true);
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
  return with_bucket(
      t, m, [&](const cost_model& under) { return priced(kind, bytes, t, under, root, m); });
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
    case algorithm_kind::broadcast_chain_leaders:
    case algorithm_kind::reduce_hier:
    case algorithm_kind::reduce_chain_leaders:
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
      // The chain carries the buffer once through each host's link (the
      // others up to log2(hosts) or 1.6 times out of the root's), paying
      // n - 1 hops of fill: large buffers across hosts. Within one host its
      // hops through the shared-memory rings each copy every byte twice on
      // CPUs the ranks share, which the model does not price (4 ranks on 2
      // CPUs, TROUPE_ENGINE=messages: 1 MiB 585 us, the tree 343; 16 MiB
      // 12.7 ms, 8.1; 64 MiB 52 both): groups across hosts only.
      if (n >= 3 && t.hosts() >= 2)
        candidates.insert(candidates.end(), {algorithm_kind::broadcast_chain,
                                             algorithm_kind::broadcast_chain_leaders});
      break;
    case op_code::allgatherv:
      candidates = {algorithm_kind::allgather_ring, algorithm_kind::allgather_bruck};
      if (n > 2) candidates.push_back(algorithm_kind::allgather_recursive_doubling);
      candidates.insert(candidates.end(), {algorithm_kind::allgather_hier_leaders,
                                           algorithm_kind::allgather_hier_striped});
      break;
    case op_code::reduce:
      candidates = {algorithm_kind::reduce_binomial, algorithm_kind::reduce_hier};
      // As the broadcast's chain, reversed (each rank reduces a segment while
      // the next travels): large buffers across hosts (within one, as the
      // broadcast's: 4 ranks on 2 CPUs, 64 MiB 78 ms, the tree 67).
      if (n >= 3 && t.hosts() >= 2)
        candidates.insert(candidates.end(),
                          {algorithm_kind::reduce_chain, algorithm_kind::reduce_chain_leaders});
      break;
    case op_code::reduce_scatterv:
      candidates = {algorithm_kind::reduce_scatter_ring};
      if (n > 2) candidates.push_back(algorithm_kind::reduce_scatter_halving);
      candidates.insert(candidates.end(), {algorithm_kind::reduce_scatter_hier_leaders,
                                           algorithm_kind::reduce_scatter_hier_striped});
      break;
    case op_code::alltoallv:  // Bruck's steps: even splits only (alltoall_runs_bruck)
      candidates = {algorithm_kind::alltoall_pairwise};
      // Bruck's log2 n dependent steps from 8 ranks on: below, its 2 steps
      // at 4 ranks against the exchange's 3 messages at once are a wash the
      // model cannot call, and the exchange takes split sizes passed on some
      // ranks and not on others (Bruck's needs them on none).
      if (n >= 8) candidates.push_back(algorithm_kind::alltoall_bruck);
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
