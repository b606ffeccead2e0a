#pragma once
// data_plane — how one rank's process exchanges collective bytes with ranks
// in other processes.
//
// Terms: a "process peer" is a rank whose world lives in another process.
// Set-up (connect): every rank writes its process identity to the store; if
// any rank lives elsewhere, the rank listens (loopback unless told
// otherwise), publishes its address, connects to every process peer and
// proves with the job's secret that it belongs to the job (a connection
// without the right secret is refused, logged, and never reaches a group).
// Bytes: frames (transport/frame.hpp) travel over a shared-memory ring when
// both ranks share a host (unless TROUPE_TRANSPORT=tcp), otherwise over the
// TCP connection. The TCP connection stays open in both cases: its end tells
// that the peer's process is gone, which fails every call still waiting for
// that peer at once.
// Receipt: a reader thread per incoming connection decodes frames straight
// into tensors and hands them to the local group actor named in the frame,
// or (fabric frames) to the group's fabric sink; a fabric payload goes
// straight into the tensor its operation posted for it, when there is one
// (the output: the receiver then copies nothing). A thread waiting for a
// fabric operation may read a TCP connection itself (pump): a socket read by
// the waiting thread answers in about 3 µs, a reader thread woken by the
// kernel in about 20 µs. While such a thread pumps, the reader thread parks.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/actors.hpp"
#include "transport/frame.hpp"
#include "troupe/store.hpp"

namespace troupe::detail {

struct data_plane_options {
  int rank = 0;
  int world_size = 1;
  std::string job;
  std::string token;
  std::string bind_address = "127.0.0.1";
  std::string transport = "auto";  ///< auto, tcp, shm
  std::chrono::milliseconds timeout{30000};
};

class data_plane {
 public:
  explicit data_plane(data_plane_options opts);
  ~data_plane();
  data_plane(const data_plane&) = delete;
  data_plane& operator=(const data_plane&) = delete;

  /// Learns where every rank lives and connects to the ranks in other processes.
  void connect(store& s);
  /// Whether world rank `r` lives in this process.
  bool is_local(int r) const;
  /// Whether world rank `r` can map this rank's shared memory: it lives in
  /// this process, or on this host and shared memory is not switched off.
  bool shares_memory(int r) const;
  /// "world rank 3 (host h, pid 4711)".
  std::string describe(int r) const;

  void send(int world_rank, const std::string& group, const envelope& env);
  void send(int world_rank, const std::string& group, const p2p_envelope& env);
  /// Sends collective data for the fabric of `group` in world rank's process.
  /// The calling thread may be the one reading its peers' sockets: while the
  /// connection cannot take more bytes it calls `while_full()` (which reads
  /// them), so two ranks sending to each other at once never wait on each
  /// other's full buffers.
  /// A peer that takes nothing until `deadline` is given up on (its
  /// connection is closed: the frame cannot be taken back half written).
  void send_fabric(int world_rank, const std::string& group, const envelope& env,
                   const std::function<void()>& while_full,
                   std::chrono::steady_clock::time_point deadline);

  /// Where fabric frames for `group` go (called on the thread that read them).
  using fabric_sink = std::function<void(received_frame&)>;
  /// Where the payload of a fabric frame for `group` may be read to (a
  /// receive posted in advance, frame.hpp), asked before it is read.
  using fabric_place = std::function<posted_receive(const frame_header&)>;
  void add_sink(const std::string& group, fabric_sink sink, fabric_place place = {});
  void remove_sink(const std::string& group);

  /// Whether frames from world rank `r` arrive over its TCP connection (not
  /// through shared memory), so that pump() can read them.
  bool reads_socket(int r) const;
  /// Reads what world rank r's connection has, without blocking, and
  /// dispatches it (skipped while another thread reads it); true when a frame
  /// arrived.
  bool pump(int r);
  /// A thread starts (+1) or stops (-1) pumping r's connection; while one
  /// does, the reader thread parks. Stopping with `wake` resumes it at once.
  void pumping(int r, int delta, bool wake);
  /// Why world rank r is gone (empty while it is connected).
  std::string gone_reason(int r);

  /// Routes frames for `group` to `actor` (and tells it about peers that die).
  void add_group(const std::string& group, const group_actor& actor);
  void remove_group(const std::string& group);

  /// Connections refused for a bad handshake so far.
  std::uint64_t refused() const noexcept { return refused_.load(); }

 private:
  struct peer;
  void accept_loop();
  void serve(int fd);
  /// The reader thread of `rank`'s incoming connection (socket or ring).
  void reader_loop(int rank);
  /// Hands a frame from rank r to its group; false after a goodbye.
  bool dispatch(int r, received_frame& f);
  /// Reads r's socket until it has nothing more (the caller holds in_mtx).
  bool drain(int r, bool& any);
  void peer_gone(int rank, const std::string& why, bool crashed);
  template <class Envelope>
  void send_frame(int world_rank, const std::string& group, const Envelope& env);

  data_plane_options opts_;
  std::vector<std::unique_ptr<peer>> peers_;  // by world rank
  int remote_count_ = 0;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> refused_{0};
  std::mutex mtx_;  // guards groups_, threads_, connected_
  std::condition_variable connected_cv_;
  int connected_ = 0;
  std::map<std::string, group_actor> groups_;
  std::map<std::string, std::pair<fabric_sink, fabric_place>> sinks_;
  std::vector<std::thread> threads_;
};

}  // namespace troupe::detail
