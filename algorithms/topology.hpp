#pragma once
// group_topology — where the ranks of a group live: the host of each group
// rank, as the engines learn it from the data plane (the same answer on
// every rank, so every rank chooses the same algorithm). Hosts are numbered
// in the order of their first rank.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace troupe::detail {

struct cost_model;

struct group_topology {
  std::vector<int> host_of;                // group rank -> host index
  std::vector<std::vector<int>> ranks_on;  // host index -> its group ranks, ascending
  /// Unique to each topology flat() or of_hosts() made (0: one made
  /// otherwise): what select.cpp's cache of choices knows it by.
  std::uint64_t id = 0;
  /// The link costs the group's algorithms are chosen by: its world's,
  /// measured at start (TROUPE_LINK_COSTS=measure), else none here and
  /// model() is the process's (cost_model::of_process()).
  std::shared_ptr<const cost_model> costs;
  /// Its ranks live in more than one process: their messages go through the
  /// data plane (a socket, or a ring between processes), each a system call
  /// or a wake-up, as between hosts.
  bool processes = false;

  /// Every rank on one host (what an engine that knows no hosts assumes).
  static std::shared_ptr<const group_topology> flat(
      int size, std::shared_ptr<const cost_model> costs = nullptr);
  /// From each group rank's host name (`processes`: see above).
  static std::shared_ptr<const group_topology> of_hosts(
      const std::vector<std::string>& names, std::shared_ptr<const cost_model> costs = nullptr,
      bool processes = false);

  int size() const noexcept { return static_cast<int>(host_of.size()); }
  int hosts() const noexcept { return static_cast<int>(ranks_on.size()); }
  /// Whether its messages leave the process (processes, or more than one host).
  bool messages_leave_process() const noexcept { return processes || hosts() > 1; }
  /// The model the group's algorithms are chosen by (costs, else the
  /// process's).
  const cost_model& model() const noexcept;
  /// Every host holds the same number of the group's ranks.
  bool uniform() const noexcept;
  /// The ranks of the busiest host.
  int most_on_a_host() const noexcept;
  /// Rank r's place among the ranks of its host.
  int local_index(int r) const;
  /// The group's ranks host by host (a ring in this order crosses between
  /// hosts once per host, not once per rank).
  std::vector<int> host_order() const;
};

/// The `size` ranks of a group as a chain from `root` (broadcast_chain):
/// the root, the other ranks of its host in local order, then every other
/// host's ranks, host after host from the root's (where `t` knows the
/// hosts; else rank order from the root, around). A chain in this order
/// crosses into and out of each host once.
std::vector<int> chain_order(const group_topology& t, int size, int root);

/// The chains' links (broadcast_chain, reduce_chain): each rank's parent
/// (-1: the root's) and children, the children that cross between hosts
/// first. Through every rank in chain_order; or, `through_leaders`, through
/// each host's first rank in that order (the root on its own), each also
/// starting a chain of its host's other ranks (with no hosts known, the
/// whole chain is the root's host's). `depth`: the ranks on the longest
/// path from the root, what chain_segments sizes the segments by, and its
/// last rank.
struct chain_tree {
  std::vector<int> parent;
  std::vector<std::vector<int>> children;
  int depth = 1;
  int deepest = 0;  ///< the (first) rank at that depth
};
chain_tree chain_links(const group_topology& t, int size, int root, bool through_leaders);

/// A rank's view of the striped hierarchies' columns (allreduce_hier,
/// allgather_hier, reduce_scatter_hier; hosts of as many ranks each;
/// column 0 is the hosts' first ranks, the leaders, on any hosts):
/// column q is the ranks of local index q, one on each host, in host order.
struct host_columns {
  host_columns(const group_topology& t, int rank);
  const group_topology& t;
  const std::vector<int>& mine;  ///< this rank's host's ranks
  int me;                        ///< this rank's local index (its column)
  int local;                     ///< ranks on a host
  int hosts;
  /// Host h's rank of column q.
  int at(int h, int q) const {
    return t.ranks_on[static_cast<std::size_t>(h)][static_cast<std::size_t>(q)];
  }
  /// The local rank of index q.
  int peer(int q) const { return mine[static_cast<std::size_t>(q)]; }
  /// Column q's ranks, in host order.
  std::vector<int> column(int q) const;
};

/// The hosts' leaders of a rooted collective across hosts (broadcast_hier,
/// reduce_hier): the root on its own host, the first rank on every other.
struct host_leaders {
  host_leaders(const group_topology& t, int root);
  int root_host;
  /// Host h's leader.
  int of(int h) const;
  /// Every host's leader, in host order (the root's at root_host).
  std::vector<int> all() const;

 private:
  const group_topology& t_;
  int root_;
};

}  // namespace troupe::detail
