#pragma once
// The store actor: the server side of troupe::tcp_store, on one page.
//
// It holds the key-value map. Every request carries the job's token first; a
// request with a wrong or missing token is answered with an errc::store error
// ("tcp_store: request refused: wrong job token"), counted and logged. Blocking
// reads (get, wait, multi_get) are one message, kv_wait: the actor keeps the
// caller's promise and answers once every key exists, or with the keys still
// missing when the caller's timeout passes, or drops it when the caller is gone.
// The store actor is never published (no CAF port is open): clients reach it
// through sessions, one per connection (store/store_gate.hpp) and one per
// client in the server's own process, which turn store_wire requests into its
// messages and its answers back.

#include <caf/all.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "store/store_wire.hpp"
#include "troupe/store.hpp"

namespace troupe::detail {
/// One request to the store and where its answer goes (never leaves the process).
struct store_call {
  store_request request;
  std::function<void(store_reply)> done;  ///< called on the session's thread
};
using store_call_ptr = std::shared_ptr<store_call>;
}  // namespace troupe::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::store_call_ptr)

namespace troupe::detail {

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

/// The store server. The first std::string of every request is the job token.
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

/// Configures the actor system of a store server: the low-latency scheduler
/// (sharing) and the byte-vector message types.
void configure_store_system(caf::actor_system_config& cfg);

/// Spawns the store actor; it refuses requests whose token differs from
/// `token` and counts them in `refused`.
store_actor spawn_store_actor(caf::actor_system& sys, std::string token,
                              std::shared_ptr<std::atomic<std::uint64_t>> refused);

/// Spawns a session with `server`: each store_call_ptr it receives is asked
/// of the server (with `token`) and its answer handed to the call's done().
/// The server drops the waiters of a session that exited.
caf::actor spawn_store_session(caf::actor_system& sys, store_actor server, std::string token);

/// The refusal every store answers a wrong token with.
inline constexpr const char* refused_token_message = "tcp_store: request refused: wrong job token";

/// Makes a caf::error that carries a troupe error code and message (actors/work_relay.cpp).
caf::error make_troupe_error(int code, std::string message);

}  // namespace troupe::detail
