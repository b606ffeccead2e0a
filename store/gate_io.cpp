// gate_io: sockets with deadlines for the store (declarations in store/gate_io.hpp).

#include "store/gate_io.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/tcp_stream.hpp"

namespace troupe::detail {

using ms = std::chrono::milliseconds;

namespace {

bool resolve(const std::string& host, std::uint16_t port, sockaddr_in& addr, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0 || !res) {
    why = "cannot resolve '" + host + "': " + ::gai_strerror(rc);
    return false;
  }
  std::memcpy(&addr, res->ai_addr, sizeof(addr));
  ::freeaddrinfo(res);
  addr.sin_port = htons(port);
  return true;
}

/// Waits for `events` on fd until the deadline: 1 ready, 0 timed out, -1 error.
int wait_for(int fd, short events, gate_clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::ceil<ms>(deadline - gate_clock::now()).count();
    if (left <= 0) return 0;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 60000)));
    if (n < 0 && errno != EINTR) return -1;
    if (n > 0) return 1;
  }
}

}  // namespace

int gate_listen(const std::string& host, std::uint16_t port, std::string& why) {
  sockaddr_in addr{};
  if (!resolve(host, port, addr, why)) return -1;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::listen(fd, SOMAXCONN) == 0) {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);  // accepted in a loop until EAGAIN
    return fd;
  }
  why = std::strerror(errno);
  ::close(fd);
  return -1;
}

int gate_connect(const std::string& host, std::uint16_t port, gate_clock::time_point deadline,
                 std::string& why) {
  sockaddr_in addr{};
  if (!resolve(host, port, addr, why)) return -1;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    why = std::strerror(errno);
    return -1;
  }
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  if (rc != 0 && errno == EINPROGRESS) {
    const int ready = wait_for(fd, POLLOUT, deadline);
    int err = ready > 0 ? 0 : ETIMEDOUT;
    socklen_t len = sizeof(err);
    if (ready > 0) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    rc = err == 0 ? 0 : (errno = err, -1);
  }
  if (rc != 0) {
    why = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  tcp_set_no_delay(fd);
  return fd;
}

bool gate_write(int fd, const void* data, std::size_t n, gate_clock::time_point deadline) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const auto k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_for(fd, POLLOUT, deadline) > 0)
      continue;
    return false;
  }
  return true;
}

std::string gate_read(int fd, void* data, std::size_t n, gate_clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  for (std::size_t got = 0; got < n;) {
    const int ready = wait_for(fd, POLLIN, deadline);
    if (ready == 0) return "timed out";
    if (ready < 0) return "closed";
    const auto k = ::recv(fd, p + got, n - got, MSG_DONTWAIT);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (k <= 0) return "closed";
    got += static_cast<std::size_t>(k);
  }
  return "";
}

}  // namespace troupe::detail
