#pragma once
// The store actor: the server side of troupe::tcp_store (its interface,
// store_actor, is declared with every other actor in actors/actors.hpp).
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

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "actors/actors.hpp"
#include "store/store_wire.hpp"

namespace troupe::detail {

/// One request to the store and where its answer goes (a session's message,
/// store_call_ptr in actors/actors.hpp).
struct store_call {
  store_request request;
  std::function<void(store_reply)> done;  ///< called on the session's thread
};

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

}  // namespace troupe::detail
