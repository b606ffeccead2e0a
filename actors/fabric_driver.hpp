#pragma once
// Spawns the fabric driver of one (group, rank) (protocol in actors/actors.hpp).

#include <memory>

#include "actors/actors.hpp"

namespace troupe::detail {

class shm_fabric;

fabric_driver spawn_fabric_driver(caf::actor_system& sys, std::weak_ptr<shm_fabric> fabric);

}  // namespace troupe::detail
