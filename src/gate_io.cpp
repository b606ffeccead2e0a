// gate_io: the socket plumbing of the store gate (declarations and terms in
// src/gate_io.hpp).

#include "src/gate_io.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "troupe/error.hpp"

namespace troupe::detail {

using ms = std::chrono::milliseconds;

gate_workers::gate_workers() {
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0)
    throw error(errc::store, std::string("store gate: pipe: ") + std::strerror(errno));
}

gate_workers::~gate_workers() {
  stop();
  ::close(wake_[0]);
  ::close(wake_[1]);
}

bool gate_workers::spawn(std::function<void()> f) {
  std::vector<std::thread> finished;
  {
    std::lock_guard lock(m_);
    if (stopping_) return false;
    for (auto id : done_) {
      finished.push_back(std::move(threads_.at(id)));
      threads_.erase(id);
    }
    done_.clear();
    const auto id = next_++;
    threads_[id] = std::thread([this, id, f = std::move(f)] {
      try {
        f();
      } catch (...) {  // a connection's failure must not end the process
      }
      std::lock_guard l(m_);
      done_.push_back(id);
    });
  }
  for (auto& t : finished) t.join();  // they have finished; joining is immediate
  return true;
}

bool gate_workers::add(int fd) {
  std::lock_guard lock(m_);
  if (stopping_) {
    ::close(fd);
    return false;
  }
  fds_.insert(fd);
  return true;
}

void gate_workers::close(int fd) {
  std::lock_guard lock(m_);
  fds_.erase(fd);
  ::close(fd);
}

void gate_workers::stop() {
  std::map<std::uint64_t, std::thread> threads;
  {
    std::lock_guard lock(m_);
    stopping_ = true;
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    [[maybe_unused]] auto n = ::write(wake_[1], "x", 1);
    threads.swap(threads_);
  }
  for (auto& [id, t] : threads) t.join();
}

bool gate_workers::stopping() {
  std::lock_guard lock(m_);
  return stopping_;
}

int gate_workers::wait(int fd, short events, gate_clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<ms>(deadline - gate_clock::now()).count();
    if (left <= 0) return 0;
    pollfd p[2] = {{fd, events, 0}, {wake_[0], POLLIN, 0}};
    const int n = ::poll(p, 2, static_cast<int>(std::min<long long>(left, 60000)));
    if (n < 0 && errno != EINTR) return -1;
    if (p[1].revents) return -1;
    if (n > 0 && p[0].revents) return 1;
  }
}

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

}  // namespace

/// A listening socket on host:port, or -1 with `why`.
int gate_listen(const std::string& host, std::uint16_t port, std::string& why) {
  sockaddr_in addr{};
  if (!resolve(host, port, addr, why)) return -1;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && ::listen(fd, 128) == 0)
    return fd;
  why = std::strerror(errno);
  ::close(fd);
  return -1;
}

namespace {

void no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

/// Connects to host:port by the deadline (one attempt; it ends early on stop), or -1 with `why`.
int gate_connect(gate_workers& w, const std::string& host, std::uint16_t port,
                 gate_clock::time_point deadline, std::string& why) {
  sockaddr_in addr{};
  if (!resolve(host, port, addr, why)) return -1;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (!w.add(fd)) {
    why = "stopping";
    return -1;
  }
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  if (rc != 0 && errno == EINPROGRESS) {
    const int ready = w.wait(fd, POLLOUT, deadline);
    int err = ready > 0 ? 0 : ETIMEDOUT;
    socklen_t len = sizeof(err);
    if (ready > 0) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    rc = err == 0 ? 0 : (errno = err, -1);
  }
  if (rc != 0) {
    why = std::strerror(errno);
    w.close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  no_delay(fd);
  return fd;
}

bool gate_write(int fd, const void* data, std::size_t n) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    auto k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

/// Reads exactly n bytes by the deadline: "" when done, else why not.
std::string gate_read(gate_workers& w, int fd, void* data, std::size_t n,
                      gate_clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  for (std::size_t got = 0; got < n;) {
    const int ready = w.wait(fd, POLLIN, deadline);
    if (ready < 0) return "stopping";
    if (ready == 0) return "timed out";
    auto k = ::recv(fd, p + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return "closed";
    got += static_cast<std::size_t>(k);
  }
  return "";
}

namespace {

/// Copies src to dst until either fails or closes.
void pump(int src, int dst) {
  std::array<char, 64 * 1024> buf;
  for (;;) {
    auto k = ::recv(src, buf.data(), buf.size(), 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0 || !gate_write(dst, buf.data(), static_cast<std::size_t>(k))) return;
  }
}

}  // namespace

/// Splices a and b both ways until either side closes; then both are shut down.
void gate_splice(int a, int b) {
  auto both_down = [a, b] {
    ::shutdown(a, SHUT_RDWR);
    ::shutdown(b, SHUT_RDWR);
  };
  std::thread back([&] {
    pump(b, a);
    both_down();
  });
  pump(a, b);
  both_down();
  back.join();
}

namespace {

bool same_address(const sockaddr_in& x, const sockaddr_in& y) {
  return x.sin_family == AF_INET && y.sin_family == AF_INET &&
         x.sin_addr.s_addr == y.sin_addr.s_addr && x.sin_port == y.sin_port;
}

}  // namespace

/// Whether the other end of the accepted loopback connection fd is a socket of this process.
bool gate_peer_is_this_process(int fd) {
  sockaddr_in peer{}, local{};
  socklen_t len = sizeof(peer);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) return false;
  len = sizeof(local);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) return false;
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return true;  // no /proc: cannot tell, accept (the listener is on loopback)
  bool found = false;
  while (auto* e = ::readdir(dir)) {
    char* end = nullptr;
    const long n = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || n == fd) continue;
    sockaddr_in a{}, b{};
    socklen_t la = sizeof(a), lb = sizeof(b);
    if (::getsockname(static_cast<int>(n), reinterpret_cast<sockaddr*>(&a), &la) == 0 &&
        same_address(a, peer) &&
        ::getpeername(static_cast<int>(n), reinterpret_cast<sockaddr*>(&b), &lb) == 0 &&
        same_address(b, local)) {
      found = true;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

/// Accepts connections on listen_fd until stop, handing each (tracked) to `handle`.
void gate_accept(gate_workers& w, int listen_fd, std::function<bool(int)> admit_now,
                 std::function<void(int)> handle) {
  while (w.wait(listen_fd, POLLIN, gate_clock::now() + std::chrono::hours(24 * 365)) > 0) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {  // out of descriptors or memory: do not spin on the pending connection
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        std::this_thread::sleep_for(ms(50));
      continue;
    }
    no_delay(fd);
    if (!admit_now(fd) || !w.add(fd)) continue;
    if (!w.spawn([handle, fd] { handle(fd); })) w.close(fd);
  }
}

}  // namespace troupe::detail
