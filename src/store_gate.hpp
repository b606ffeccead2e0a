#pragma once
// store_gate — a token-checking gate in front of the tcp_store's CAF endpoint.
//
// Why it exists: the store server is a CAF actor reached over BASP (CAF 0.17's
// binary protocol). BASP reads a 32-byte header and then allocates (and zeroes)
// a receive buffer of whatever payload size the header announces — before any
// handshake, let alone the job token, which the store actor only checks inside
// each request. One unauthenticated connection announcing 0xfffffff0 bytes made
// the server allocate ~4 GiB and stall its multiplexer for seconds. So no byte
// of an unauthenticated peer may reach CAF:
//
//  - store_gate (server side) listens on the public address. Each connection
//    must first send the preamble "TROUPES1", a big-endian u32 token length
//    (1..4096) and the token, within 5 s. A wrong, short, slow or garbled
//    preamble is refused (logged "[troupe store] refused connection from
//    <peer>: <reason>", counted, closed; a wrong token is answered with byte 0
//    first). A right one is answered with byte 1, and from then on the bytes
//    are spliced both ways to the CAF endpoint, which is published on
//    127.0.0.1 with an ephemeral port only.
//  - store_forwarder (client side) listens on 127.0.0.1:0 for the client's own
//    CAF middleman. Each connection from this process (others are dropped) is
//    carried to the real store: connect, send the preamble, await the byte,
//    then splice. A refused token makes token_refused() true and the CAF
//    connection closes, so the client's connect fails at once.
//
// What remains: a process on the server's own host can reach the loopback CAF
// endpoint directly (as it could reach a loopback-only store before); requests
// still carry the token, which the store actor checks.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace troupe::detail {

/// The first bytes of every connection to a store.
inline constexpr char gate_magic[8] = {'T', 'R', 'O', 'U', 'P', 'E', 'S', '1'};
/// The longest job token the preamble carries.
inline constexpr std::size_t gate_max_token = 4096;
/// How long a new connection may take to present its preamble.
inline constexpr std::chrono::milliseconds gate_handshake_timeout{5000};

class gate_workers;

/// The server's gate: admits connections that prove the job token and splices them to CAF.
class store_gate {
 public:
  /// Listens on bind_address:port (0: a free port); throws errc::store
  /// "tcp_store_server: cannot listen on host:port: why" when it cannot.
  store_gate(const std::string& bind_address, std::uint16_t port, std::string token);
  /// Stops accepting, closes every connection and joins every thread.
  ~store_gate();
  store_gate(const store_gate&) = delete;
  store_gate& operator=(const store_gate&) = delete;
  /// Starts admitting connections, splicing them to 127.0.0.1:inner_port.
  void start(std::uint16_t inner_port);
  std::uint16_t port() const noexcept { return port_; }
  /// Connections refused so far (wrong token, garbage, truncated, too slow).
  std::uint64_t refused() const noexcept { return refused_->load(); }

 private:
  void accept_loop();
  void admit(int fd, const std::string& peer);
  void refuse(const std::string& peer, const std::string& why);
  std::string check_preamble(int fd);

  std::string token_;
  int listen_fd_ = -1;
  std::uint16_t port_ = 0;
  std::uint16_t inner_port_ = 0;
  std::shared_ptr<std::atomic<std::uint64_t>> refused_;
  std::atomic<int> pending_{0};  // connections still presenting their preamble
  std::unique_ptr<gate_workers> workers_;
};

/// The client's forwarder: CAF connects to port(); the forwarder reaches host:port through its
/// gate.
class store_forwarder {
 public:
  /// Listens on 127.0.0.1:0; `connect_timeout` bounds each connection's attempt to reach the
  /// store. Throws errc::invalid_argument for a token longer than gate_max_token.
  store_forwarder(std::string host, std::uint16_t port, std::string token,
                  std::chrono::milliseconds connect_timeout);
  ~store_forwarder();
  store_forwarder(const store_forwarder&) = delete;
  store_forwarder& operator=(const store_forwarder&) = delete;
  /// The loopback port for this process's CAF middleman.
  std::uint16_t port() const noexcept { return port_; }
  /// Whether the store answered this process's token with a refusal.
  bool token_refused() const noexcept { return token_refused_.load(); }
  /// Why the latest connection could not be carried to the store (then cleared); empty if none.
  std::string take_failure();

 private:
  void accept_loop();
  void carry(int local);
  void fail(std::string why);

  std::string host_;
  std::uint16_t remote_port_;
  std::string token_;
  std::chrono::milliseconds connect_timeout_;
  int listen_fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> token_refused_{false};
  std::unique_ptr<gate_workers> workers_;
  struct failure;
  std::unique_ptr<failure> failure_;
};

}  // namespace troupe::detail
