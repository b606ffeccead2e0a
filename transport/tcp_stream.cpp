#include "transport/tcp_stream.hpp"
#include "base/texts.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "troupe/error.hpp"

namespace troupe::detail {

tcp_stream::~tcp_stream() {
  close();
  if (fd_ >= 0) ::close(fd_);
}

bool tcp_stream::write(const void* data, std::size_t n) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    auto w = ::send(fd_, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool tcp_stream::read(void* data, std::size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    auto r = ::recv(fd_, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

void tcp_stream::close() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

namespace {

sockaddr_in resolve(const std::string& host, std::uint16_t port, const char* op) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0 || !res)
    throw error(errc::invalid_argument,
                std::string(op) + ": cannot resolve address '" + host + "': " + gai_strerror(rc));
  sockaddr_in addr{};
  std::memcpy(&addr, res->ai_addr, sizeof(addr));
  ::freeaddrinfo(res);
  addr.sin_port = htons(port);
  return addr;
}

}  // namespace

int tcp_listen(const std::string& address, std::uint16_t port) {
  auto addr = resolve(address, port, "data plane listen");
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, SOMAXCONN) != 0) {
    auto why = std::string(std::strerror(errno));
    ::close(fd);
    throw error(errc::backend, "data plane: cannot listen on " + address + ":" +
                                   std::to_string(port) + ": " + why);
  }
  return fd;
}

std::uint16_t tcp_local_port(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

int tcp_connect(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout) {
  auto addr = resolve(host, port, "data plane connect");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string why;
  for (auto pause = std::chrono::milliseconds(1);;
       pause = std::min(pause * 2, std::chrono::milliseconds(100))) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      tcp_set_no_delay(fd);
      return fd;
    }
    why = std::strerror(errno);
    ::close(fd);
    if (std::chrono::steady_clock::now() + pause > deadline) break;
    std::this_thread::sleep_for(pause);
  }
  throw error(errc::timeout, "data plane: " + detail::timeout_after(timeout) + " connecting to " +
                                 host + ":" + std::to_string(port) + " (" + why + ")");
}

std::string tcp_peer_name(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "unknown peer";
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &addr.sin_addr, buf, sizeof(buf));
  return std::string(buf) + ":" + std::to_string(ntohs(addr.sin_port));
}

void tcp_set_no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void tcp_set_read_timeout(int fd, std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((t.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

bool tcp_within_host(int fd) {
  sockaddr_in mine{}, theirs{};
  socklen_t a = sizeof(mine), b = sizeof(theirs);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &a) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &b) != 0 ||
      theirs.sin_family != AF_INET)
    return false;
  const auto peer = ntohl(theirs.sin_addr.s_addr);
  return (peer >> 24) == 127 || theirs.sin_addr.s_addr == mine.sin_addr.s_addr;
}

namespace {

bool set_congestion(int fd, const std::string& name) {
  return ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(),
                      static_cast<socklen_t>(name.size())) == 0;
}

/// The first line of a /proc/sys file ("" when it cannot be read).
std::string sysctl_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

[[noreturn]] void refused(const std::string& choice, int err) {
  throw error(errc::invalid_argument,
              "world: TROUPE_TCP_CONGESTION '" + choice +
                  "': the kernel refuses it for this process (" + std::strerror(err) +
                  "; allowed: " + sysctl_line("/proc/sys/net/ipv4/tcp_allowed_congestion_control") +
                  "; available: " +
                  sysctl_line("/proc/sys/net/ipv4/tcp_available_congestion_control") + ")");
}

}  // namespace

void tcp_check_congestion(const std::string& choice) {
  if (choice == "auto" || choice == "system") return;
  bool named = !choice.empty() && choice.size() <= 15;
  for (unsigned char c : choice) named = named && (std::isalnum(c) || c == '_' || c == '-');
  if (!named)
    throw error(errc::invalid_argument,
                "world: TROUPE_TCP_CONGESTION '" + choice +
                    "' is not auto, system or a congestion control's name (letters, digits, _ "
                    "or -, at most 15)");
  const int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return;  // no socket to try it on: the connections will tell
  const bool ok = set_congestion(probe, choice);
  const int err = errno;
  ::close(probe);
  if (!ok) refused(choice, err);
}

void tcp_choose_congestion(int fd, const std::string& choice) {
  if (choice == "system") return;
  if (choice == "auto") {
    if (tcp_within_host(fd)) set_congestion(fd, "reno");  // built in, allowed to everyone
    return;
  }
  if (!set_congestion(fd, choice)) refused(choice, errno);
}

}  // namespace troupe::detail
