// Sockets on 127.0.0.1 at a port the kernel picks, for the suites that play
// a store, a peer or a stranger by hand.
#pragma once

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <utility>

namespace troupe::test {

/// A listening socket on 127.0.0.1 at a free port, and that port.
inline std::pair<int, std::uint16_t> loopback_listener(int backlog = 64) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  REQUIRE(::listen(fd, backlog) == 0);
  return {fd, ntohs(a.sin_port)};
}

/// A port that was free on loopback a moment ago.
inline std::uint16_t free_port() {
  const auto [fd, port] = loopback_listener(1);
  ::close(fd);
  return port;
}

}  // namespace troupe::test
