#pragma once
// The actor protocol of one rank, on one page (as Tenzir's actors.hpp).
//
// A rank is an actor system (detail::rank_runtime) holding:
//  - one group actor per group the rank belongs to: it runs each collective
//    (numbered by the backend at issue) as a message protocol with the group
//    actors of the other ranks, holds messages that arrive early, and answers
//    the request with the outputs;
//  - beside them, for a group whose ranks all share the host, the group's
//    shared-memory engine (inline/): allreduce and barrier run there, in the
//    threads that wait for them, without actor messages;
//  - one work relay: the façade's calls go through it, and it turns the group
//    actor's response (a promise) into the completion of a troupe::work.

#include <caf/all.hpp>

#include "base/call.hpp"
#include "troupe/tensor.hpp"

namespace troupe::detail {
class transport;
}

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::call_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::p2p_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::envelope)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::p2p_envelope)
#ifndef TROUPE_TENSOR_LIST_MESSAGE_TYPE
#define TROUPE_TENSOR_LIST_MESSAGE_TYPE
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::tensor_list)
#endif
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<troupe::detail::transport>)

namespace troupe::detail {

using run_atom = caf::atom_constant<caf::atom("run")>;
using p2p_atom = caf::atom_constant<caf::atom("p2p")>;
using data_atom = caf::atom_constant<caf::atom("data")>;
using msg_atom = caf::atom_constant<caf::atom("msg")>;
using timeout_atom = caf::atom_constant<caf::atom("timeout")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using peers_atom = caf::atom_constant<caf::atom("peers")>;
using submit_atom = caf::atom_constant<caf::atom("submit")>;
using gone_atom = caf::atom_constant<caf::atom("gone")>;

/// The group actor of one (group, rank).
using group_actor = caf::typed_actor<
    // Runs a collective: assigns the next sequence number, runs the algorithm
    // with the peers and answers the call's outputs (or an error).
    caf::replies_to<run_atom, call_ptr>::with<tensor_list>,
    // Runs a send (answers once the payload is handed over) or a receive
    // (answers once a matching message arrived).
    caf::replies_to<p2p_atom, p2p_ptr>::with<tensor_list>,
    // Collective data from a peer group actor (may arrive before the call).
    caf::reacts_to<data_atom, envelope>,
    // A point-to-point message from a peer.
    caf::reacts_to<msg_atom, p2p_envelope>,
    // Self-message: the earliest deadline passed; fails every call past its timeout.
    caf::reacts_to<timeout_atom>,
    // World rank R's process is gone (data plane). It left on purpose: calls
    // waiting for it fail. It crashed (last field true): every pending and
    // later call of the group fails.
    caf::reacts_to<gone_atom, int, std::string, bool>,
    // Fails every pending operation with the reason; later calls fail too.
    caf::reacts_to<abort_atom, std::string>,
    // Installs the transport to the peers (once, before any call); answers when done.
    caf::replies_to<peers_atom, std::shared_ptr<transport>>::with<bool>>;

/// The rank's work relay.
using relay_actor = caf::typed_actor<
    // Requests `call` from the group actor and completes call->handle with the answer.
    caf::reacts_to<submit_atom, call_ptr, group_actor>,
    // Same for a point-to-point call.
    caf::reacts_to<submit_atom, p2p_ptr, group_actor>>;

/// Makes a caf::error that carries a troupe error code and message.
caf::error make_troupe_error(int code, std::string message);
/// Turns a caf::error (troupe's own or CAF's) into the exception a work fails with.
std::exception_ptr to_exception(const caf::error& e, const std::string& context);

}  // namespace troupe::detail
