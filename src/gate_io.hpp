#pragma once
// gate_io — the socket plumbing of the store gate (src/store_gate.hpp): threads
// and sockets that stop together, connecting and reading with deadlines,
// splicing two sockets, and telling whether a loopback peer is this process.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace troupe::detail {

using gate_clock = std::chrono::steady_clock;

/// The threads and sockets of a gate or forwarder; stop() ends them all.
class gate_workers {
 public:
  gate_workers();
  ~gate_workers();
  gate_workers(const gate_workers&) = delete;
  gate_workers& operator=(const gate_workers&) = delete;
  /// Runs f in a tracked thread (joining finished ones first); false when stopping.
  bool spawn(std::function<void()> f);
  /// Tracks fd so that stop() shuts it down; when stopping, closes it and answers false.
  bool add(int fd);
  /// Stops tracking fd and closes it.
  void close(int fd);
  /// Shuts every tracked socket down, wakes every wait() and joins every thread.
  void stop();
  bool stopping();
  /// Waits until fd has poll `events` (1), the deadline passes (0) or stop() is called (-1).
  int wait(int fd, short events, gate_clock::time_point deadline);

 private:
  std::mutex m_;
  bool stopping_ = false;
  int wake_[2] = {-1, -1};
  std::set<int> fds_;
  std::map<std::uint64_t, std::thread> threads_;
  std::vector<std::uint64_t> done_;
  std::uint64_t next_ = 0;
};

/// A listening socket on host:port (IPv4; 0: a free port), or -1 with `why`.
int gate_listen(const std::string& host, std::uint16_t port, std::string& why);
/// Connects to host:port by the deadline (one attempt, ended early by stop), or -1 with `why`.
/// The socket is tracked by `w`, blocking, with TCP_NODELAY.
int gate_connect(gate_workers& w, const std::string& host, std::uint16_t port,
                 gate_clock::time_point deadline, std::string& why);
/// Writes all n bytes; false when the connection fails.
bool gate_write(int fd, const void* data, std::size_t n);
/// Reads exactly n bytes by the deadline: "" when done, else "timed out", "closed" or "stopping".
std::string gate_read(gate_workers& w, int fd, void* data, std::size_t n,
                      gate_clock::time_point deadline);
/// Copies a to b and b to a (one thread each way) until either side closes; then shuts both down.
void gate_splice(int a, int b);
/// Whether the other end of the accepted loopback connection fd is a socket of this process.
bool gate_peer_is_this_process(int fd);
/// Accepts on listen_fd until stop: each connection that `admit_now` keeps (it closes the
/// others) is tracked and handed to `handle` in a thread of its own.
void gate_accept(gate_workers& w, int listen_fd, std::function<bool(int)> admit_now,
                 std::function<void(int)> handle);

}  // namespace troupe::detail
