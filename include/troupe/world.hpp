#pragma once
/// troupe::world — one rank: its actor system, store, default group and the
/// registry of its groups. No process-wide state: many worlds (ranks) can
/// live in one process, which is how tests and simulations run.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/process_group.hpp"
#include "troupe/store.hpp"

namespace troupe {

namespace detail {
class rank_runtime;
}

struct world_options {
  /// "actor", "cpu:actor,cuda:nccl", or the name of a registered backend.
  std::string backend = "actor";
  /// Shared by all ranks (a hash_store in one process, a file_store across processes).
  std::shared_ptr<troupe::store> store;
  int rank = -1;
  int world_size = -1;
  /// Default timeout of collectives and of group set-up (default_pg_timeout,
  /// c10d's 30 minutes).
  std::chrono::milliseconds timeout = default_pg_timeout;
  /// How ranks in other processes are reached: "auto" (shared memory on one
  /// host, TCP between hosts), "tcp" or "shm". TROUPE_TRANSPORT overrides it.
  std::string transport = "auto";
  /// Address the data plane listens on and publishes to its peers. Empty
  /// (default): the address this host reaches MASTER_ADDR from when that is
  /// another host's, else loopback. TROUPE_BIND_ADDR, then TROUPE_SOCKET_IFNAME
  /// (an interface's address), override it.
  std::string bind_address;
  /// The job's secret, proven by every data-plane connection (TROUPE_JOB_TOKEN).
  std::string token;
};

/// Its members all have defaults, so designated initializers may name any
/// of them (`{.use_local_synchronization = true}`).
struct new_group_options {
  /// Defaults to the world's timeout.
  std::optional<std::chrono::milliseconds> timeout{};
  /// Defaults to the world's backend string.
  std::string backend{};
  /// Only the members call new_group; non-members get no group (nullptr).
  bool use_local_synchronization = false;
  /// Free text shown in errors and describe(); defaults to the group name.
  std::string description{};
};

class world {
 public:
  /// Joins the world: rendezvous through the store with the other ranks, then
  /// creates the default group. Throws errc::invalid_argument for a bad rank,
  /// size, store or backend string, errc::timeout when the others do not arrive.
  explicit world(world_options opts);
  world(std::string backend, std::shared_ptr<troupe::store> store, int rank, int world_size,
        std::chrono::milliseconds timeout = default_pg_timeout);
  ~world();
  world(const world&) = delete;
  world& operator=(const world&) = delete;

  int rank() const noexcept;
  int size() const noexcept;
  const std::shared_ptr<troupe::store>& get_store() const noexcept;
  std::chrono::milliseconds timeout() const noexcept;
  const std::string& backend_string() const noexcept;
  /// The link costs this world's groups choose their algorithms by, in
  /// TROUPE_LINK_COSTS's syntax ("host=50us:1.25e+08B/s,..."): measured at
  /// start where TROUPE_LINK_COSTS says `measure` and the ranks run on more
  /// than one host (the same on every rank), else as configured.
  std::string link_costs() const;

  /// The group of all ranks.
  process_group& default_group();
  /// This rank's flight record of every group it belongs to, in issue order
  /// (troupe/flight_recorder.hpp).
  std::vector<flight_entry> flight_record() const;

  /// Creates a group of `ranks` (world ranks, any order, no duplicates). Without
  /// local synchronization every rank of the world must call it, in the same
  /// order; non-members receive a non-member group. With it, only members call;
  /// non-members receive nullptr. Groups with equal members never collide.
  std::shared_ptr<process_group> new_group(std::vector<int> ranks, new_group_options opts = {});

  /// Group rank of world rank `global_rank` in `group`.
  int get_group_rank(const process_group& group, int global_rank) const;
  /// World rank of group rank `group_rank` in `group`.
  int get_global_rank(const process_group& group, int group_rank) const;
  /// World ranks of `group`'s members.
  std::vector<int> get_process_group_ranks(const process_group& group) const;
  /// Destroys `group` (pending work fails; the group is no longer registered).
  void destroy_process_group(const std::shared_ptr<process_group>& group);
  /// Fails every pending operation of every group with `reason`; later calls fail too.
  void abort(const std::string& reason);

  /// Recovery after a member of `group` died or left (as ULFM's
  /// MPI_Comm_shrink): the surviving members agree on who is left and get a
  /// new group of them, ranked in the old order, with sequence numbers from 1.
  /// Every survivor calls it once per failure it recovers from. A member
  /// counts as gone when its process is known to have ended, when its world
  /// was destroyed, or when it has not called shrink within `timeout`; the
  /// first survivor to decide writes the member list to the store and every
  /// other adopts it, so all agree. A caller the others already counted out
  /// gets errc::peer_failure; errc::timeout when the decision does not come.
  /// This rank leaves `group` first (as ULFM's revoke): a survivor still
  /// blocked in it on this rank fails at once and comes to shrink too.
  std::shared_ptr<process_group> shrink(
      process_group& group, std::chrono::milliseconds timeout = std::chrono::seconds(30));

  /// Internal: the rank's actor runtime.
  detail::rank_runtime& runtime() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
