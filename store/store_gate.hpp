#pragma once
// store_gate — the one door of a tcp_store server, and the wire behind it.
//
// Why it exists: a CAF actor reached over BASP (CAF 0.17's binary protocol)
// reads a 32-byte header and then allocates (and zeroes) whatever payload
// size the header announces, before any handshake. One connection announcing
// 0xfffffff0 bytes would make a server allocate ~4 GiB, and a gate in front
// of a published actor would leave its loopback CAF port open to any local
// process. So the store actor is not published at all: no CAF port is open,
// and this gate is the only socket.
//
// One thread serves everything with poll():
//  - strangers: each connection must first send the preamble "TROUPES2", a
//    big-endian u32 token length (1..4096) and the token: its first bytes
//    within 500 ms of being accepted (silent connections stay with the
//    kernel meanwhile), the whole within 2 s; at most 256 may be at it at
//    once (for a newcomer the oldest of the busiest source is dropped), and
//    none gets a thread or more than its 4 KiB of token
//    (transport/pending_handshakes.hpp). A wrong, short, slow or garbled
//    preamble is refused (logged "[troupe store] refused connection from
//    <peer>: <reason>", at most 10 lines a second, counted, closed; a wrong
//    token is answered with byte 0 first). A right one is answered with byte 1
//    and who serves (a u8 length, then "troupe-run (pid 7) on host h"), so
//    that a client that loses the store can name the process that died;
//  - admitted connections: requests (store/store_wire.hpp, at most 1 GiB each,
//    buffered as their bytes arrive) go to a session actor of the connection
//    (store/store_actor.hpp), whose answers are written back at once or,
//    when the socket is full, by this thread. A malformed request closes the
//    connection. A connection that asked to be watched (tcp_store::
//    append_on_disconnect) and ends without a goodbye has its values
//    appended to their keys: the store tells that a client's process died.

#include <cstdint>
#include <memory>
#include <string>

#include "store/store_actor.hpp"

namespace troupe::detail {

class store_gate {
 public:
  /// Listens on bind_address:port (0: a free port); throws errc::store
  /// "tcp_store_server: cannot listen on host:port: why" when it cannot.
  /// `served_by` (at most 255 bytes) is what every admitted client is told
  /// of this process: "troupe-run (pid 7) on host h".
  store_gate(const std::string& bind_address, std::uint16_t port, std::string token,
             std::string served_by);
  /// Stops serving, closes every connection, ends their sessions and joins the thread.
  ~store_gate();
  store_gate(const store_gate&) = delete;
  store_gate& operator=(const store_gate&) = delete;
  /// Starts serving: admitted connections get sessions with `server` in `sys`.
  void start(caf::actor_system& sys, store_actor server);
  std::uint16_t port() const noexcept;
  /// Connections refused so far (wrong token, garbage, truncated, too slow, too many).
  std::uint64_t refused() const noexcept;
  /// Admitted connections open now.
  std::size_t connections() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::detail
