// tcp_exchange — the TCP ceiling of an allreduce, measured on loopback
// without troupe.
//
// 2 processes (the default): whatever algorithm it uses, an allreduce of N
// bytes between two processes over TCP moves at least N bytes out of and N
// bytes into each process (a ring: two messages of N/2 each way). Two
// processes (fork), one TCP connection (TCP_NODELAY), each sending N bytes to
// the other and receiving N bytes from it at the same time; nothing is
// reduced, so a real allreduce cannot be faster.
//
// --ranks n (n >= 3): the bytes a ring allreduce of N bytes moves, without
// the reduction. n processes in a ring on loopback (one connection to each
// neighbour), each sending 2(n-1)/n·N bytes to its right and receiving as
// many from its left at once, in 1 MiB pieces: the first N/n sent from its
// N-byte input (a ring's first step sends the caller's data), the rest from a
// 1 MiB window (partial sums still in the cache); the first half received
// into a 1 MiB window (the reduce-scatter's share, consumed in the cache by a
// pipelined reduction) and the second half into its N-byte output (the
// allgather writes every byte of it). Every choice favours the ring, so an
// allreduce over these connections cannot be faster. The processes are not
// bound (more ranks than CPUs, as troupe-run and mpirun place them then).
//
//   tcp_exchange [--csv F] [--quick] [--mib 16,64] [--iters K] [--method M] [--ranks n]
//
// Per size: the received bytes are checked once, then (after warm-ups) each
// timed exchange runs between a one-byte handshake each way and ends when
// the process has sent and received all N bytes; the time of an exchange is
// the slower process's, a record holds the median. Three ways of driving the
// socket are measured, as --method picks (default all): `threads` (a sender
// thread next to the receiving one, blocking I/O, one call for all N bytes),
// `poll` (one thread, non-blocking send and recv as poll() allows) and
// `stream` (as threads, in 1 MiB pieces received into one 1 MiB window, as a
// pipelined allreduce consumes them while they are in the cache); each with
// the processes free and bound to a CPU each (as troupe-run and mpirun place
// two ranks). The record is the fastest of them. (The ring has one way: a
// sender thread next to the receiving one, in pieces as described.)
// Its busbw is N / time, algbw the same (nccl-tests' busbw of an allreduce is
// algbw * 2(n-1)/n = algbw for n = 2); the ring's busbw is 2(n-1)/n·N / time.
// Records: system "tcp-ceiling", transport "tcp", ranks n, op "allreduce",
// appended to F.
//
// Sizes: 16 and 64 MiB (--quick: 16 MiB); --mib picks others (a list of MiB).
// Iterations: 20 timed after 3 warm-ups; --iters K overrides the timed count.

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "bench_common.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

/// No single step waits longer: a side that died or hangs fails the other.
constexpr int io_timeout_s = 60;

[[noreturn]] void fail(const std::string& what) {
  if (errno == EAGAIN || errno == EWOULDBLOCK)
    throw std::runtime_error(what + ": timed out after " + std::to_string(io_timeout_s) + " s");
  throw std::system_error(errno, std::generic_category(), what);
}

void send_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("send");
    p += w;
    n -= std::size_t(w);
  }
}

void recv_all(int fd, char* p, std::size_t n) {
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
void handshake(int fd) {
  char b = 1;
  send_all(fd, &b, 1);
  recv_all(fd, &b, 1);
}

enum class method { threads, poll, stream };

const char* method_name(method m) {
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
void send_while_receiving(int send_fd, Send send, Receive receive) {
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

/// Sends n bytes of `out` and receives n bytes into `in` at the same time.
void exchange(int fd, method m, const char* out, char* in, std::size_t n) {
  if (m == method::stream) {
    send_while_receiving(
        fd,
        [&] {
          for (std::size_t off = 0; off < n; off += stream_piece)
            send_all(fd, out + off, std::min(stream_piece, n - off));
        },
        [&] {
          for (std::size_t off = 0; off < n; off += stream_piece)
            recv_all(fd, in, std::min(stream_piece, n - off));
        });
    return;
  }
  if (m == method::threads) {
    send_while_receiving(
        fd, [&] { send_all(fd, out, n); }, [&] { recv_all(fd, in, n); });
    return;
  }
  std::size_t sent = 0, got = 0;
  while (sent < n || got < n) {
    pollfd p{fd, short((got < n ? POLLIN : 0) | (sent < n ? POLLOUT : 0)), 0};
    const int ready = ::poll(&p, 1, io_timeout_s * 1000);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) fail("poll");
    if (ready == 0) throw std::runtime_error("poll: timed out");
    if (p.revents & (POLLERR | POLLNVAL)) throw std::runtime_error("poll: socket error");
    if (sent < n && (p.revents & POLLOUT)) {
      const ssize_t w = ::send(fd, out + sent, n - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w > 0)
        sent += std::size_t(w);
      else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        fail("send");
    }
    if (got < n && (p.revents & (POLLIN | POLLHUP))) {
      const ssize_t r = ::recv(fd, in + got, n - got, MSG_DONTWAIT);
      if (r > 0)
        got += std::size_t(r);
      else if (r == 0)
        throw std::runtime_error("recv: the peer closed the connection");
      else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        fail("recv");
    }
  }
}

/// Byte i of what process `side` sends: differs between the sides and along
/// the buffer, so that a misplaced or foreign byte is caught.
std::uint8_t pattern(int side, std::size_t i) {
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
const cpu_set_t& usable_cpus() {
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
void place(int side, bool bound) {
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
const std::vector<std::string> congestions = {"system", "reno"};

/// Gives the connection `name` ("system": the kernel's default again).
void set_congestion(int fd, const std::string& name) {
  std::string cc = name;
  if (name == "system") {
    std::ifstream in("/proc/sys/net/ipv4/tcp_congestion_control");
    std::getline(in, cc);
    if (cc.empty()) return;  // unknown: the socket keeps what it has
  }
  if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc.data(), socklen_t(cc.size())) != 0)
    fail("congestion control " + cc);
}

/// One process's side: per size and method, a checked exchange, warm-ups,
/// then `iters` timed exchanges; returns their times in µs, in that order.
std::vector<double> run_side(int fd, int side, const options& o) {
  std::vector<double> us;
  for (std::size_t n : o.bytes) {
    const std::size_t elems = (n + sizeof(float) - 1) / sizeof(float);
    auto out_buf = bench::alloc_floats(elems), in_buf = bench::alloc_floats(elems);
    char* out = reinterpret_cast<char*>(out_buf.get());
    char* in = reinterpret_cast<char*>(in_buf.get());
    for (std::size_t i = 0; i < n; ++i) out[i] = char(pattern(side, i));
    // The bytes are checked once, whole (stream keeps only a window).
    std::memset(in, 0, n);
    handshake(fd);
    exchange(fd, method::threads, out, in, n);
    for (std::size_t i = 0; i < n; ++i)
      if (std::uint8_t(in[i]) != pattern(1 - side, i))
        throw std::runtime_error("byte " + std::to_string(i) + " of " + std::to_string(n) +
                                 " received wrong");
    for (const auto& cc : congestions) {
      set_congestion(fd, cc);
      for (bool bound : {false, true}) {
        place(side, bound);
        for (method m : o.methods)
          for (int it = 0; it < o.warmup + o.iters; ++it) {
            handshake(fd);
            const auto t0 = clock_type::now();
            exchange(fd, m, out, in, n);
            const auto t1 = clock_type::now();
            if (it >= o.warmup)
              us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
          }
      }
    }
    place(side, false);
  }
  return us;
}

/// Timeouts on blocking calls (accept, send, recv).
void set_timeouts(int fd) {
  const timeval t{io_timeout_s, 0};
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &t, sizeof t) != 0)
    fail("socket timeouts");
}

/// The connection's options: TCP_NODELAY (as a collectives library sets it)
/// and the timeouts; buffer sizes stay the kernel's (autotuned).
void set_options(int fd) {
  const int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) fail("TCP_NODELAY");
  set_timeouts(fd);
}

/// The times of a forked process, to the parent (a pipe).
void write_times(int fd, const std::vector<double>& us) {
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

std::vector<double> read_times(int fd, std::size_t count) {
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

/// Both sides; returns the records (the parent's view: MAX of both per exchange).
std::vector<bench::record> measure(const options& o) {
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  if (ls < 0) fail("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls, 1) != 0 ||
      ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    fail("listen on 127.0.0.1");
  int times[2];  // the child's times, to the parent
  if (::pipe(times) != 0) fail("pipe");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) fail("fork");
  if (pid == 0) {
    int rc = 0;
    try {
      ::close(ls);
      ::close(times[0]);
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fail("connect");
      set_options(fd);
      write_times(times[1], run_side(fd, 1, o));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tcp_exchange (child): %s\n", e.what());
      rc = 1;
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  ::close(times[1]);
  std::vector<double> mine, theirs;
  std::string error;
  int fd = -1;
  try {
    set_timeouts(ls);
    fd = ::accept(ls, nullptr, nullptr);
    if (fd < 0) fail("accept");
    set_options(fd);
    mine = run_side(fd, 0, o);
    theirs = read_times(times[0], mine.size());
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (fd >= 0) ::close(fd);  // before waiting: a child still in recv sees the end
  ::close(ls);
  ::close(times[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!error.empty()) throw std::runtime_error(error);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("the child process failed");

  std::vector<bench::record> rows;
  std::size_t k = 0;
  for (std::size_t n : o.bytes) {
    bench::record best;
    for (const auto& cc : congestions)
      for (const char* placement : {"free", "bound"})
        for (method m : o.methods) {
          std::vector<double> us(o.iters);
          for (int i = 0; i < o.iters; ++i, ++k) us[i] = std::max(mine[k], theirs[k]);
          const double t = bench::median(us);
          std::printf("tcp exchange %8s each way, %-6s %-7s %-5s: %10.1f us  %7.3f GB/s\n",
                      bench::size_label(n).c_str(), cc.c_str(), method_name(m), placement, t,
                      double(n) / (t * 1e-6) / 1e9);
          if (best.ranks == 0 || t < best.median_us)
            best = {"tcp-ceiling", "tcp", 2, "allreduce", n, o.iters, t, 0, 0};
        }
    best.algbw = best.busbw = double(n) / (best.median_us * 1e-6) / 1e9;
    rows.push_back(best);
  }
  return rows;
}

// -- the ring (--ranks n, n >= 3) --------------------------------------------

/// The bytes each process of a ring allreduce of `n_bytes` over `ranks`
/// sends (and receives): 2(n-1)/n·N.
std::size_t ring_bytes(std::size_t n_bytes, int ranks) {
  return 2 * std::size_t(ranks - 1) * (n_bytes / std::size_t(ranks));
}

/// A process's buffers for one size: what the ring reads and writes.
struct ring_buffers {
  std::size_t total = 0;  ///< bytes each way
  std::size_t first = 0;  ///< sent from the input (the ring's first step)
  std::shared_ptr<float> input, output, window_out, window_in;
};

ring_buffers ring_buffers_for(std::size_t n_bytes, int ranks) {
  auto floats = [](std::size_t bytes) {
    auto b = bench::alloc_floats((bytes + sizeof(float) - 1) / sizeof(float));
    std::memset(b.get(), 1, bytes);  // touched: no page faults while timed
    return b;
  };
  ring_buffers r;
  r.total = ring_bytes(n_bytes, ranks);
  r.first = n_bytes / std::size_t(ranks);
  r.input = floats(n_bytes);
  r.output = floats(n_bytes);
  r.window_out = floats(stream_piece);
  r.window_in = floats(stream_piece);
  return r;
}

/// One pass of the ring: sends b.total bytes to `right` (the first b.first
/// from the input, the rest from a window) while receiving as many from
/// `left` (the first half into a window, the second into the output), in
/// pieces of at most stream_piece that never cross those boundaries. With
/// `check`, the bytes sent are pattern(me) from `check_out` and those received
/// land whole in `check_in`.
void ring_pass(int left, int right, const ring_buffers& b, const char* check_out = nullptr,
               char* check_in = nullptr) {
  const char* input = reinterpret_cast<const char*>(b.input.get());
  const char* window_out = reinterpret_cast<const char*>(b.window_out.get());
  char* output = reinterpret_cast<char*>(b.output.get());
  char* window_in = reinterpret_cast<char*>(b.window_in.get());
  const std::size_t half = b.total / 2;
  send_while_receiving(
      right,
      [&] {
        for (std::size_t off = 0; off < b.total;) {
          std::size_t len = std::min(stream_piece, b.total - off);
          if (off < b.first) len = std::min(len, b.first - off);
          const char* from = check_out ? check_out + off : off < b.first ? input + off : window_out;
          send_all(right, from, len);
          off += len;
        }
      },
      [&] {
        for (std::size_t off = 0; off < b.total;) {
          std::size_t len = std::min(stream_piece, b.total - off);
          if (off < half) len = std::min(len, half - off);
          char* into = check_in ? check_in + off : off < half ? window_in : output + (off - half);
          recv_all(left, into, len);
          off += len;
        }
      });
}

/// Process `me` of the ring: per size a checked pass, warm-ups, then
/// o.iters timed passes; returns their times in µs, in that order.
std::vector<double> run_ring_side(int left, int right, int me, const options& o) {
  const int n = o.ranks;
  std::vector<double> us;
  for (std::size_t bytes : o.bytes) {
    const auto b = ring_buffers_for(bytes, n);
    {
      std::vector<char> out(b.total), in(b.total, 0);
      for (std::size_t i = 0; i < b.total; ++i) out[i] = char(pattern(me, i));
      ring_pass(left, right, b, out.data(), in.data());
      const int from = (me + n - 1) % n;
      for (std::size_t i = 0; i < b.total; ++i)
        if (std::uint8_t(in[i]) != pattern(from, i))
          throw std::runtime_error("byte " + std::to_string(i) + " of " + std::to_string(b.total) +
                                   " received wrong");
    }
    for (const auto& cc : congestions) {
      set_congestion(right, cc);  // (the sending side's decides)
      for (int it = 0; it < o.warmup + o.iters; ++it) {
        // A token around the ring: nobody starts before its left neighbour did.
        char token = 1;
        send_all(right, &token, 1);
        recv_all(left, &token, 1);
        const auto t0 = clock_type::now();
        ring_pass(left, right, b);
        const auto t1 = clock_type::now();
        if (it >= o.warmup)
          us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
    }
  }
  return us;
}

/// The ring's processes (this one is process 0, the others forked); returns
/// the records (per pass the slowest process's time).
std::vector<bench::record> measure_ring(const options& o) {
  const int n = o.ranks;
  std::vector<int> listeners(n, -1);
  std::vector<sockaddr_in> addrs(n);
  for (int i = 0; i < n; ++i) {
    listeners[i] = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listeners[i] < 0) fail("socket");
    sockaddr_in& a = addrs[i];
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listeners[i], reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listeners[i], 1) != 0 ||
        ::getsockname(listeners[i], reinterpret_cast<sockaddr*>(&a), &len) != 0)
      fail("listen on 127.0.0.1");
    set_timeouts(listeners[i]);
  }
  // Process `me`: connects to its right neighbour, accepts its left one.
  auto join = [&](int me, int& left, int& right) {
    right = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const auto& a = addrs[(me + 1) % n];
    if (right < 0 || ::connect(right, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
      fail("connect");
    set_options(right);
    left = ::accept(listeners[me], nullptr, nullptr);
    if (left < 0) fail("accept");
    set_options(left);
    for (int& fd : listeners) {
      ::close(fd);
      fd = -1;
    }
  };
  std::vector<int> pipes(n, -1);  // the children's times, to process 0
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int me = 1; me < n; ++me) {
    int times[2];
    if (::pipe(times) != 0) fail("pipe");
    const pid_t pid = ::fork();
    if (pid < 0) fail("fork");
    if (pid == 0) {
      int rc = 0;
      try {
        ::close(times[0]);
        for (int fd : pipes)
          if (fd >= 0) ::close(fd);
        int left = -1, right = -1;
        join(me, left, right);
        write_times(times[1], run_ring_side(left, right, me, o));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "tcp_exchange (ring process %d): %s\n", me, e.what());
        rc = 1;
      }
      std::fflush(nullptr);
      ::_exit(rc);
    }
    ::close(times[1]);
    pipes[me] = times[0];
    pids.push_back(pid);
  }
  std::vector<double> slowest;
  std::string error;
  int left = -1, right = -1;
  try {
    join(0, left, right);
    slowest = run_ring_side(left, right, 0, o);
    for (int me = 1; me < n; ++me) {
      const auto theirs = read_times(pipes[me], slowest.size());
      for (std::size_t i = 0; i < slowest.size(); ++i) slowest[i] = std::max(slowest[i], theirs[i]);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Before waiting: a process still in recv sees the end.
  for (int fd : {left, right})
    if (fd >= 0) ::close(fd);
  for (int fd : listeners)
    if (fd >= 0) ::close(fd);
  for (int fd : pipes)
    if (fd >= 0) ::close(fd);
  bool children_ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    children_ok = children_ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!error.empty()) throw std::runtime_error(error);
  if (!children_ok) throw std::runtime_error("a ring process failed");

  std::vector<bench::record> rows;
  std::size_t k = 0;
  for (std::size_t bytes : o.bytes) {
    const double moved = double(ring_bytes(bytes, n));
    double t = 0;
    for (const auto& cc : congestions) {
      std::vector<double> us(slowest.begin() + std::ptrdiff_t(k),
                             slowest.begin() + std::ptrdiff_t(k + std::size_t(o.iters)));
      k += std::size_t(o.iters);
      const double m = bench::median(us);
      std::printf(
          "tcp ring of %d, %8s allreduce's bytes (%s each way), %-6s: %10.1f us  %7.3f "
          "GB/s\n",
          n, bench::size_label(bytes).c_str(), bench::size_label(ring_bytes(bytes, n)).c_str(),
          cc.c_str(), m, moved / (m * 1e-6) / 1e9);
      t = t == 0 ? m : std::min(t, m);
    }
    bench::record r{"tcp-ceiling", "tcp", n, "allreduce", bytes, o.iters, t, 0, 0};
    r.algbw = double(bytes) / (t * 1e-6) / 1e9;
    r.busbw = moved / (t * 1e-6) / 1e9;
    rows.push_back(r);
  }
  return rows;
}

options parse(int argc, char** argv) {
  options o;
  bool quick = false;
  std::string mib;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(f + " expects a value");
      return argv[++i];
    };
    if (f == "--csv") {
      o.csv = value();
    } else if (f == "--quick") {
      quick = true;
    } else if (f == "--mib") {
      mib = value();
    } else if (f == "--iters") {
      const std::string v = value();
      o.iters = std::atoi(v.c_str());
      if (o.iters < 1) throw std::invalid_argument("--iters expects a positive integer");
    } else if (f == "--ranks") {
      const std::string v = value();
      o.ranks = std::atoi(v.c_str());
      if (o.ranks < 2 || o.ranks > 64)
        throw std::invalid_argument("--ranks expects 2 to 64, got '" + v + "'");
    } else if (f == "--method") {
      const std::string v = value();
      if (v == "threads")
        o.methods = {method::threads};
      else if (v == "poll")
        o.methods = {method::poll};
      else if (v == "stream")
        o.methods = {method::stream};
      else if (v != "all")
        throw std::invalid_argument("--method expects threads, poll, stream or all");
    } else {
      throw std::invalid_argument("unknown argument '" + f + "'");
    }
  }
  if (mib.empty()) {
    o.bytes = {std::size_t(16) << 20};
    if (!quick) o.bytes.push_back(std::size_t(64) << 20);
  } else {
    std::istringstream is(mib);
    for (std::string v; std::getline(is, v, ',');) {
      const double m = std::atof(v.c_str());
      if (!(m > 0)) throw std::invalid_argument("--mib expects sizes in MiB, got '" + mib + "'");
      o.bytes.push_back(std::max<std::size_t>(1, std::size_t(m * (1 << 20))));
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
    const auto rows = o.ranks == 2 ? measure(o) : measure_ring(o);
    bench::print_records(rows);
    if (!o.csv.empty()) bench::append_csv(o.csv, rows);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tcp_exchange: %s\n", e.what());
    return 1;
  }
}
