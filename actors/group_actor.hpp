#pragma once
// The group actor of one (group, rank): see actors/actors.hpp for its protocol.

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "actors/actors.hpp"

namespace troupe::detail {

/// Who the group actor is.
struct group_info {
  std::string name;
  int rank = 0;
  int size = 0;
  std::vector<int> global_ranks;
  /// Where a timed-out call tells whom it waited for (base/wait_chain.hpp);
  /// null: a timeout names only the rank it waited for.
  std::shared_ptr<troupe::store> waits;
  /// rank_runtime::leaving_together (null: the actor always tells its peers).
  std::shared_ptr<const std::atomic<bool>> leaving_together;
  /// The link costs the world measured at start (data_plane::link_costs();
  /// empty: the process's model chooses the algorithms).
  std::string link_costs;
};

group_actor spawn_group_actor(caf::actor_system& sys, group_info info);

}  // namespace troupe::detail
