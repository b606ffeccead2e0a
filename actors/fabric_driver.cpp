// The fabric driver: keeps a group's shared-memory collectives moving while
// no thread waits for them (see fabric/shm_fabric.hpp and actors/actors.hpp).

#include "actors/fabric_driver.hpp"

#include "fabric/shm_fabric.hpp"

namespace troupe::detail {

namespace {

struct driver_state {
  std::chrono::microseconds delay{50};
  static inline const char* name = "troupe.fabric_driver";
};

}  // namespace

fabric_driver spawn_fabric_driver(caf::actor_system& sys, std::weak_ptr<shm_fabric> fabric) {
  using self_ptr = fabric_driver::stateful_pointer<driver_state>;
  return sys.spawn([fabric](self_ptr self) -> fabric_driver::behavior_type {
    return {
        [self, fabric](drive_atom) {
          auto f = fabric.lock();
          if (f && f->poke()) {
            self->delayed_send(self, self->state.delay, drive_atom::value);
            self->state.delay = std::min(self->state.delay * 2, std::chrono::microseconds{2000});
          } else {
            self->state.delay = std::chrono::microseconds{50};
          }
        },
    };
  });
}

}  // namespace troupe::detail
