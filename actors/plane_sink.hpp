#pragma once
// plane_sink — how the network layer (transport/data_plane.hpp) reaches a
// group actor without knowing actors: frames from other processes become
// data and msg messages, a peer that is gone a gone message (actors.hpp).

#include "actors/actors.hpp"
#include "transport/data_plane.hpp"

namespace troupe::detail {

/// The data plane's route to `actor` (messages sent as from outside any actor).
inline data_plane::group_sink plane_sink(const group_actor& actor) {
  return {
      [actor](envelope env) { caf::anon_send(actor, data_atom::value, std::move(env)); },
      [actor](p2p_envelope env) { caf::anon_send(actor, msg_atom::value, std::move(env)); },
      [actor](int r, const std::string& why, bool crashed) {
        caf::anon_send(actor, gone_atom::value, r, why, crashed);
      },
      {},
      {},
  };
}

}  // namespace troupe::detail
