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
#include "tcp_exchange.hpp"

namespace {

using namespace tcp_bench;
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
