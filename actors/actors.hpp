#pragma once
// The actor protocol of troupe, on one page (as Tenzir's actors.hpp): every
// actor interface, each message with what it does and what it answers.
//
// A rank is an actor system (detail::rank_runtime) holding:
//  - one group actor per group the rank belongs to (actors/group_actor.cpp):
//    it owns the group's sequence numbers, membership, failure and abort, and
//    runs the collectives that need actors (monitored_barrier, point to
//    point, cuda tensors staged through host memory, everything with
//    TROUPE_ENGINE=actors) as message protocols (algorithms/) with the group
//    actors of the other ranks; it holds messages that arrive early and
//    answers each request with the outputs. The collectives of CPU tensors
//    run beside it, in the inline engine (inline/engine.hpp): in the threads
//    that wait for them, without actor messages (a thread hop costs 10-20 us
//    on these machines, a flag in shared memory 0.05-0.25 us);
//  - one work relay (actors/work_relay.cpp): the façade's calls to group
//    actors go through it, and it turns the response (a promise) into the
//    completion of a troupe::work;
//  - one device actor per GPU it uses (actors/device_actor.cpp): it owns the
//    rank's CUDA stream there and runs the GPU jobs of every backend;
//  - on the rank that serves a tcp_store, the store actor
//    (store/store_actor.cpp) and one session per client connection.

#include <caf/all.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/call.hpp"
#include "troupe/store.hpp"
#include "troupe/tensor.hpp"

namespace troupe::detail {
class actor_peers;
/// One request to the store and where its answer goes (never leaves the
/// process; defined with the store's wire types in store/store_actor.hpp).
struct store_call;
using store_call_ptr = std::shared_ptr<store_call>;
namespace gpu {
struct device_job;
}
/// One job for a device actor (cuda/device_queue.hpp).
using device_job_ptr = std::shared_ptr<gpu::device_job>;
}  // namespace troupe::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::store_call_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::device_job_ptr)

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::call_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::p2p_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::envelope)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::p2p_envelope)
#ifndef TROUPE_TENSOR_LIST_MESSAGE_TYPE
#define TROUPE_TENSOR_LIST_MESSAGE_TYPE
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::tensor_list)
#endif
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<troupe::detail::actor_peers>)

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
    caf::replies_to<peers_atom, std::shared_ptr<actor_peers>>::with<bool>>;

/// The rank's work relay.
using relay_actor = caf::typed_actor<
    // Requests `call` from the group actor and completes call->handle with the answer.
    caf::reacts_to<submit_atom, call_ptr, group_actor>,
    // Same for a point-to-point call.
    caf::reacts_to<submit_atom, p2p_ptr, group_actor>>;

// -- the device actor (one per GPU per rank) ----------------------------------

using gpu_job_atom = caf::atom_constant<caf::atom("gpujob")>;
using gpu_done_atom = caf::atom_constant<caf::atom("gpudone")>;
using gpu_poll_atom = caf::atom_constant<caf::atom("gpupoll")>;
using gpu_abort_atom = caf::atom_constant<caf::atom("gpuabort")>;

using device_actor = caf::typed_actor<
    // Makes the device current, enqueues the job's work on the rank's stream,
    // records an event and asks CUDA to call back on the host when the
    // stream gets there; a job whose enqueue throws fails at once.
    caf::reacts_to<gpu_job_atom, device_job_ptr>,
    // The host callback: the stream passed job `id`: runs its `after` and
    // completes its work.
    caf::reacts_to<gpu_done_atom, std::uint64_t>,
    // Self-message, every millisecond while jobs are pending: a finished
    // event completes its job (a callback may be late), a failed event, a
    // failed health check or a passed deadline fails it.
    caf::reacts_to<gpu_poll_atom>,
    // Fails every pending job with the reason (the actor stays usable).
    caf::reacts_to<gpu_abort_atom, std::string>>;

// -- the store actor (tcp_store's server) and its sessions --------------------

using kv_set_atom = caf::atom_constant<caf::atom("kv_set")>;
using kv_mset_atom = caf::atom_constant<caf::atom("kv_mset")>;
using kv_add_atom = caf::atom_constant<caf::atom("kv_add")>;
using kv_cas_atom = caf::atom_constant<caf::atom("kv_cas")>;
using kv_append_atom = caf::atom_constant<caf::atom("kv_append")>;
using kv_check_atom = caf::atom_constant<caf::atom("kv_check")>;
using kv_wait_atom = caf::atom_constant<caf::atom("kv_wait")>;
using kv_del_atom = caf::atom_constant<caf::atom("kv_del")>;
using kv_count_atom = caf::atom_constant<caf::atom("kv_count")>;
using kv_expire_atom = caf::atom_constant<caf::atom("kv_expire")>;

/// The store server. The first std::string of every request is the job
/// token; a wrong one is answered with errc::store ("tcp_store: request
/// refused: wrong job token"), counted and logged.
using store_actor = caf::typed_actor<
    // (token, key, value): sets key to value; answers true.
    caf::replies_to<kv_set_atom, std::string, std::string, bytes>::with<bool>,
    // (token, keys, values): sets every key to the value at its index; answers true.
    caf::replies_to<kv_mset_atom, std::string, std::vector<std::string>,
                    std::vector<bytes>>::with<bool>,
    // (token, key, delta): adds delta to the decimal counter at key; answers the new value.
    caf::replies_to<kv_add_atom, std::string, std::string, std::int64_t>::with<std::int64_t>,
    // (token, key, expected, desired): compare-and-set; answers the value afterwards.
    caf::replies_to<kv_cas_atom, std::string, std::string, bytes, bytes>::with<bytes>,
    // (token, key, value): appends value to key (creating it); answers true.
    caf::replies_to<kv_append_atom, std::string, std::string, bytes>::with<bool>,
    // (token, keys): answers whether every key exists, without waiting.
    caf::replies_to<kv_check_atom, std::string, std::vector<std::string>>::with<bool>,
    // (token, keys, timeout_ms, want_values): answers (missing keys, values) once every
    // key exists (missing empty; values in key order if wanted) or when timeout_ms
    // passed (the keys still missing, no values).
    caf::replies_to<kv_wait_atom, std::string, std::vector<std::string>, std::int64_t,
                    bool>::with<std::vector<std::string>, std::vector<bytes>>,
    // (token, key): removes key; answers whether it existed.
    caf::replies_to<kv_del_atom, std::string, std::string>::with<bool>,
    // (token): answers the number of keys.
    caf::replies_to<kv_count_atom, std::string>::with<std::int64_t>,
    // Self-message: the deadline of waiter `id` passed (ignored from anyone else).
    caf::reacts_to<kv_expire_atom, std::uint64_t>>;

/// A store session (dynamically typed: caf::actor) takes one message, a
/// store_call_ptr: it asks the call's request of the store actor (with the
/// session's token) and hands the answer to the call's done(). The store
/// actor drops the waiters of a session that exited.

/// Makes a caf::error that carries a troupe error code and message.
caf::error make_troupe_error(int code, std::string message);
/// Turns a caf::error (troupe's own or CAF's) into the exception a work fails with.
std::exception_ptr to_exception(const caf::error& e, const std::string& context);

}  // namespace troupe::detail
