#pragma once
// flat_costs — the prices of the flat algorithms (cost_model.hpp): each a
// sum of its steps (cost_steps.hpp) on any layout of hosts, by the
// algorithm's own message pattern. algorithm_costs.cpp builds the
// hierarchies' prices from them and chooses.

#include "algorithms/cost_steps.hpp"

namespace troupe::detail::cost {

/// The ring's allreduce: 2(n-1) steps of a block (bytes / n) each, in
/// host order.
double ring_allreduce(const group_topology& t, const cost_model& m, double bytes);

/// Recursive doubling's allreduce over the virtual ranks (the largest
/// power of two <= n; the first extra ranks folded into their partners and
/// unfolded at the end): log2 p exchanges of the whole buffer.
double recursive_doubling(const group_topology& t, const cost_model& m, double bytes);

/// Recursive halving then doubling over the virtual ranks of
/// recursive_doubling (the same fold and unfold): at halving step s each
/// rank sends the half of its range it gives up, bytes · mask / p with
/// mask = p >> (s+1); the doubling steps mirror them. Each halving step's
/// reduction waits for its whole message (the ring reduces one segment
/// while the next travels): it adds the bytes reduced at local memory speed.
double rabenseifner(const group_topology& t, const cost_model& m, double bytes);

/// The ring's reduce-scatter: n-1 steps of a block each; a step's segments
/// are reduced as they arrive while the next ones travel (measured on 2 x 2
/// unshaped, 64 MiB: 70 ms, the transfer's price 74, with the reductions
/// added 94), so a step takes the longer of the two.
double ring_reduce_scatter(const group_topology& t, const cost_model& m, double bytes);

/// Rabenseifner's halving alone: the fold (the whole input), the halving
/// steps (each reduces what it receives), the unfold (one block).
double halving_reduce_scatter(const group_topology& t, const cost_model& m, double bytes);

/// Every rank sends its whole buffer to every other at once.
double direct_allreduce(const group_topology& t, const cost_model& m, double bytes);

/// The ring's allgather: n-1 steps of a block each.
double ring_allgather(const group_topology& t, const cost_model& m, double bytes);

/// Bruck's allgather: its slots are copied out in a rotation at the end.
double bruck_allgather(const group_topology& t, const cost_model& m, double bytes);

/// Recursive doubling's allgather: places host by host, as the algorithm
/// takes them; step k to the place p ^ k with k blocks; the slots copied
/// out at the end.
double doubling_allgather(const group_topology& t, const cost_model& m, double bytes);

double binomial_broadcast(const group_topology& t, const cost_model& m, double bytes, int root);

/// reduce_binomial's tree to `root`: at each mask, the ranks whose
/// position v = rank - root has it as its lowest set bit send their sums to
/// v - mask, which reduces them.
double binomial_reduce(const group_topology& t, const cost_model& m, double bytes, int root);

/// The root's binomial scatter (the range a subtree needs, largest first),
/// then a ring allgather of one block per rank.
double scatter_allgather_broadcast(const group_topology& t, const cost_model& m, double bytes);

/// broadcast_chain's pipeline: its segments (chain_segments) pass down
/// the chain from `root` (chain_links: through every rank, or through the
/// hosts' leaders, each handing them to its host), every rank forwarding
/// one while the next arrives: the first segment's hops one after another,
/// then a further segment each time the chain's busiest link or CPU has
/// moved one (its latencies hidden then).
double chain_broadcast(const group_topology& t, const cost_model& m, double bytes, int root,
                       bool through_leaders);
/// reduce_chain's pipeline: chain_broadcast's reversed, each segment also
/// reduced by each rank it reaches.
double chain_reduce(const group_topology& t, const cost_model& m, double bytes, int root,
                    bool through_leaders);

/// Rank 0 exchanging `block` bytes with every other rank at once (gather's
/// and scatter's direct algorithms: the root receives them or, where
/// `root_sends`, sends them): the root's links and CPU carry them all.
double rooted_direct(const group_topology& t, const cost_model& m, double block, bool root_sends);

/// Every rank sends its block of bytes / n to every other at once: the
/// first message costs its link's latency, each further one the sender's
/// work per message (overhead); a host's link carries every block its
/// ranks send off the host. Priced per host (the choice is made at every
/// call on every rank: a price by rounds, O(n^2), took 40% of 2,048
/// in-process ranks' time).
double pairwise_alltoall(const group_topology& t, const cost_model& m, double bytes);

/// Bruck's alltoall: ceil(log2 n) steps; at step k every rank sends the
/// blocks whose slot has bit k set (about half of them) to rank + k, packed,
/// and unpacks what rank - k sent; the blocks are rotated in before and out
/// after.
double bruck_alltoall(const group_topology& t, const cost_model& m, double bytes);

/// Rounds of dissemination: round k, every rank to rank + 2^k.
double dissemination(const group_topology& t, const cost_model& m);

}  // namespace troupe::detail::cost
