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

}  // namespace troupe::detail
