#pragma once
// What the TCP ceiling's measurements share (tcp_exchange.cpp: the pair's
// exchange and the program; tcp_ring.cpp: the ring): blocking socket I/O
// that fails with what went wrong, the byte pattern that checks what
// arrived, the options, where a process runs, the connections' settings and
// the times a forked process hands its parent.

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "bench_common.hpp"

namespace tcp_bench {

using clock_type = std::chrono::steady_clock;

/// No single step waits longer: a side that died or hangs fails the other.
constexpr int io_timeout_s = 60;

[[noreturn]] inline void fail(const std::string& what) {
  if (errno == EAGAIN || errno == EWOULDBLOCK)
    throw std::runtime_error(what + ": timed out after " + std::to_string(io_timeout_s) + " s");
  throw std::system_error(errno, std::generic_category(), what);
}

inline void send_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("send");
    p += w;
    n -= std::size_t(w);
  }
}

inline void recv_all(int fd, char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) throw std::runtime_error("recv: the peer closed the connection");
    if (r < 0) fail("recv");
    p += r;
    n -= std::size_t(r);
  }
}

/// Both processes: one byte each way, so that neither starts the clock early.
inline void handshake(int fd) {
  char b = 1;
  send_all(fd, &b, 1);
  recv_all(fd, &b, 1);
}

enum class method { threads, poll, stream };

inline const char* method_name(method m) {
  return m == method::threads ? "threads" : m == method::poll ? "poll" : "stream";
}

/// stream: the bytes go in pieces of this size and land in one piece-sized
/// window, over and over (what a pipelined allreduce does: it consumes each
/// piece while it is in the cache).
constexpr std::size_t stream_piece = std::size_t{1} << 20;

/// Runs `send` on a thread of its own while this one runs `receive`; a
/// receive that fails shuts `send_fd` down (unblocking the sender) and
/// rethrows; then what the sender threw.
template <class Send, class Receive>
inline void send_while_receiving(int send_fd, Send send, Receive receive) {
  std::exception_ptr error;
  std::thread tx([&] {
    try {
      send();
    } catch (...) {
      error = std::current_exception();
    }
  });
  try {
    receive();
  } catch (...) {
    ::shutdown(send_fd, SHUT_RDWR);
    tx.join();
    throw;
  }
  tx.join();
  if (error) std::rethrow_exception(error);
}

/// Byte i of what process `side` sends: differs between the sides and along
/// the buffer, so that a misplaced or foreign byte is caught.
inline std::uint8_t pattern(int side, std::size_t i) {
  return std::uint8_t((i * 7 + (i >> 12) + std::size_t(side) * 101) & 0xff);
}

struct options {
  std::string csv;
  std::vector<std::size_t> bytes;
  std::vector<method> methods = {method::threads, method::poll, method::stream};
  int warmup = 3;
  int iters = 20;
  int ranks = 2;  ///< 2: the exchange; more: the ring
};

/// The CPUs this process may use at start.
inline const cpu_set_t& usable_cpus() {
  static const cpu_set_t set = [] {
    cpu_set_t s;
    CPU_ZERO(&s);
    if (::sched_getaffinity(0, sizeof(s), &s) != 0) fail("sched_getaffinity");
    return s;
  }();
  return set;
}

/// Free: any usable CPU; bound: side k on the k-th usable CPU, as troupe-run
/// and mpirun place two ranks (left free when there is only one CPU).
inline void place(int side, bool bound) {
  cpu_set_t set = usable_cpus();
  if (bound && CPU_COUNT(&set) >= 2) {
    int seen = 0, cpu = -1;
    for (int c = 0; c < CPU_SETSIZE && cpu < 0; ++c)
      if (CPU_ISSET(c, &set) && seen++ == side) cpu = c;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
  }
  if (::sched_setaffinity(0, sizeof(set), &set) != 0) fail("sched_setaffinity");
}

/// The congestion controls measured: the kernel's default ("system") and
/// reno, troupe's choice for a connection within a host.
inline const std::vector<std::string> congestions = {"system", "reno"};

/// Gives the connection `name` ("system": the kernel's default again).
inline void set_congestion(int fd, const std::string& name) {
  std::string cc = name;
  if (name == "system") {
    std::ifstream in("/proc/sys/net/ipv4/tcp_congestion_control");
    std::getline(in, cc);
    if (cc.empty()) return;  // unknown: the socket keeps what it has
  }
  if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc.data(), socklen_t(cc.size())) != 0)
    fail("congestion control " + cc);
}

/// Timeouts on blocking calls (accept, send, recv).
inline void set_timeouts(int fd) {
  const timeval t{io_timeout_s, 0};
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &t, sizeof t) != 0)
    fail("socket timeouts");
}

/// The connection's options: TCP_NODELAY (as a collectives library sets it)
/// and the timeouts; buffer sizes stay the kernel's (autotuned).
inline void set_options(int fd) {
  const int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) fail("TCP_NODELAY");
  set_timeouts(fd);
}

/// The times of a forked process, to the parent (a pipe).
inline void write_times(int fd, const std::vector<double>& us) {
  const char* p = reinterpret_cast<const char*>(us.data());
  std::size_t left = us.size() * sizeof(double);
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("write");
    p += w;
    left -= std::size_t(w);
  }
}

inline std::vector<double> read_times(int fd, std::size_t count) {
  std::vector<double> us(count);
  char* p = reinterpret_cast<char*>(us.data());
  std::size_t left = count * sizeof(double);
  while (left > 0) {
    const ssize_t r = ::read(fd, p, left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw std::runtime_error("a process's times did not arrive");
    p += r;
    left -= std::size_t(r);
  }
  return us;
}

/// The ring (--ranks n, n >= 3): its processes (this one is process 0, the
/// others forked); returns the records (per pass the slowest process's time).
std::vector<bench::record> measure_ring(const options& o);

}  // namespace tcp_bench
