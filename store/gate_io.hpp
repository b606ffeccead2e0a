#pragma once
// gate_io — the socket plumbing of the store's server and clients
// (store/store_gate.hpp, store/store_client.hpp): listening, connecting, reading
// and writing with deadlines, and comparing tokens in constant time.

#include <chrono>
#include <cstdint>
#include <string>

namespace troupe::detail {

using gate_clock = std::chrono::steady_clock;

/// A non-blocking listening socket on host:port (IPv4; 0: a free port), or -1 with `why`.
int gate_listen(const std::string& host, std::uint16_t port, std::string& why);
/// Connects to host:port by the deadline (one attempt), or -1 with `why`.
/// The socket is blocking, close-on-exec, with TCP_NODELAY.
int gate_connect(const std::string& host, std::uint16_t port, gate_clock::time_point deadline,
                 std::string& why);
/// Writes all n bytes by the deadline; false when the connection fails or stalls.
bool gate_write(int fd, const void* data, std::size_t n, gate_clock::time_point deadline);
/// Reads exactly n bytes by the deadline: "" when done, else "timed out" or "closed".
std::string gate_read(int fd, void* data, std::size_t n, gate_clock::time_point deadline);
/// Compares without an early exit, so that timing does not reveal the token's content.

}  // namespace troupe::detail
