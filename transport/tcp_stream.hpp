#pragma once
// tcp_stream — a byte_stream over a connected TCP socket, plus the socket
// helpers of the data plane (listen, connect, peer address).

#include <chrono>
#include <cstdint>
#include <string>

#include "transport/frame.hpp"

namespace troupe::detail {

class tcp_stream final : public byte_stream {
 public:
  explicit tcp_stream(int fd) : fd_(fd) {}
  ~tcp_stream() override;
  bool write(const void* data, std::size_t n) override;
  bool read(void* data, std::size_t n) override;
  void close() override;
  int fd() const noexcept { return fd_; }

 private:
  int fd_;
};

/// A listening socket on address:port (port 0: any free port); throws
/// errc::backend naming the address on failure. Returns the fd.
int tcp_listen(const std::string& address, std::uint16_t port);
/// The port a socket is bound to.
std::uint16_t tcp_local_port(int fd);
/// Connects to host:port, retrying until `timeout`; throws errc::timeout
/// naming the address when it cannot.
int tcp_connect(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout);
/// "127.0.0.1:40211" of the other end.
std::string tcp_peer_name(int fd);
/// Bounds how long one read may block (handshakes with strangers).
void tcp_set_read_timeout(int fd, std::chrono::milliseconds t);
/// Sends small writes at once (TCP_NODELAY): frames, store answers.
void tcp_set_no_delay(int fd);

/// Whether both ends of a connected socket are this host (the peer is a
/// loopback address or this end's own): its bytes never leave the machine.
bool tcp_within_host(int fd);
/// Checks a TROUPE_TCP_CONGESTION value before any connection: auto,
/// system, or the name of a congestion control (letters, digits, _ or -, at
/// most 15) that the kernel lets this process set (tried on a socket of its
/// own). Throws errc::invalid_argument naming the value otherwise.
void tcp_check_congestion(const std::string& choice);
/// Sets the congestion control of a connection that carries rank data, as
/// `choice` says: "system" leaves the kernel's default; "auto" (the default)
/// gives a connection within this host reno (built in, and every process may
/// set it) and leaves others at the default; a name sets that one. Within a
/// host nothing is lost, so a loss-based congestion control never slows a
/// connection, while a pacing one (BBR, the default of some hosts) does:
/// it moves a 4-process ring's bytes on loopback a third slower than reno
/// or cubic. Throws errc::invalid_argument naming a name the kernel
/// refuses, with what it allows.
void tcp_choose_congestion(int fd, const std::string& choice);

}  // namespace troupe::detail
