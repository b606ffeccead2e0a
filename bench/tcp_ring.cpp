// tcp_exchange's ring (--ranks n, n >= 3; tcp_exchange.cpp says what it
// measures): n processes on loopback, each sending 2(n-1)/n·N bytes to its
// right while receiving as many from its left, in pieces as a pipelined
// ring allreduce moves them.

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tcp_exchange.hpp"

namespace tcp_bench {
namespace {

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

}  // namespace

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

}  // namespace tcp_bench
