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
// Strangers (transport/data_plane_accept.cpp): one thread accepts and reads
// every handshake with poll() (transport/pending_handshakes.hpp): silent
// connections stay with the kernel, at most 256 await authentication at
// once (the oldest of the busiest source dropped for a newcomer), each has
// 500 ms for its first bytes and 2 s for its whole handshake, and none gets
// a thread before it proved the job's token. A reader thread is started per
// authenticated peer (one per world rank at most) and joined as soon as its
// connection ends.
// Receipt: a reader thread per incoming connection decodes frames straight
// into tensors and hands them to the local group actor named in the frame,
// or (inline frames) to the group's inline engine sink; an inline engine payload goes
// straight into the tensor its operation posted for it, when there is one
// (the output: the receiver then copies nothing). A thread waiting for a
// inline operation may read a TCP connection itself (pump): a socket read by
// the waiting thread answers in about 3 µs, a reader thread woken by the
// kernel in about 20 µs. While such a thread pumps, the reader thread parks,
// and it lingers parked for 2 ms after a call that completed (the next call
// of a loop reads again at once); a thread that goes to sleep still waiting
// hands the connection back at once.
// Validation: before a frame's payload is allocated, its sender must be the
// group rank its connection belongs to in a group that rank is a member of
// (frame src is a group rank: mapped through the group's members to the
// connection's world rank). A frame that fails a check, that a sink refuses
// (too many early frames), or whose reading throws ends that connection: the
// peer fails as if it had died, named as the cause; the process never does.
// Peer failures: a connection that ends without a goodbye, or is dropped for
// a bad frame, fails every pending and later call of every group that rank
// belongs to (group actors by a gone message; inline engines through crashed() and
// crash_reason()). A goodbye means the rank left on purpose (only calls still
// waiting for it fail); when it left after a rank failed, the goodbye names
// that rank, so the blame lands on the cause and not on the rank that left
// after it. (It is not failed as a death: it may have finished its part, and
// it may leave long after the failure, having worked on in other groups.)

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

#include "base/write_stall.hpp"
#include "transport/frame.hpp"
#include "transport/handshake.hpp"
#include "troupe/store.hpp"

namespace troupe::detail {

class rendezvous;
class peer_memory;
struct rank_places;

/// This process's host, by name: TROUPE_HOSTNAME, else gethostname().
/// Ranks whose processes name different hosts talk over TCP.
std::string host_name();

struct data_plane_options {
  int rank = 0;
  int world_size = 1;
  std::string job;
  std::string token;
  std::string bind_address = "127.0.0.1";
  std::string transport = "auto";  ///< auto, tcp, shm
  /// The congestion control of the connections that carry data
  /// (tcp_choose_congestion): auto, system or a name.
  std::string congestion = "auto";
  std::chrono::milliseconds timeout{30000};
  /// How this rank's groups run collectives (TROUPE_ENGINE: inline,
  /// messages, staged, actors): every rank of a job must say the same, as
  /// frames of one route are not read by the other.
  std::string route = "inline";
  /// The failure detector (data_plane_heartbeat.cpp): the ranks of a peer
  /// process that stopped answering are failed within `unresponsive`
  /// (TROUPE_UNRESPONSIVE_MS; 0: never), this process telling each peer
  /// process that it runs every `heartbeat` (TROUPE_HEARTBEAT_MS; default a
  /// sixth of the bound). A busy or slow rank keeps beating: only a stopped
  /// or frozen process, or a host cut off, is silent that long.
  std::chrono::milliseconds unresponsive{3000};
  std::chrono::milliseconds heartbeat{0};
};

class data_plane : public std::enable_shared_from_this<data_plane> {
 public:
  explicit data_plane(data_plane_options opts);
  /// Closes the plane (close()) if its owner did not.
  ~data_plane();
  data_plane(const data_plane&) = delete;
  data_plane& operator=(const data_plane&) = delete;

  /// Says goodbye to the peers, closes every connection and joins the
  /// plane's threads; idempotent. Its owner calls it before letting go: the
  /// last reference may otherwise end on one of the plane's reader threads
  /// (a sink that locked the plane while its world ended), which cannot join
  /// itself. Frames sent after it are dropped.
  void close();

  /// Learns where every rank lives and connects to the ranks in other
  /// processes; waits and names missing or gone ranks through `rdv`.
  void connect(store& s, rendezvous& rdv);
  /// Whether world rank `r` lives in this process.
  bool is_local(int r) const;
  /// Whether world rank `r` can map this rank's shared memory: it lives in
  /// this process, or on this host, shared memory is not switched off and
  /// each of the two could open the other's ring.
  bool shares_memory(int r) const;
  /// World ranks on this host: this process's and those of its host peers.
  int ranks_on_host() const;
  /// How the job's ranks share their hosts' CPUs, from what every rank
  /// wrote as it joined (every rank finds the same): the hosts, and the
  /// ranks each CPU of the busiest host runs (1: a CPU for each rank).
  struct sharing {
    int hosts = 1;
    double ranks_per_cpu = 1;
  };
  const sharing& job_sharing() const noexcept { return job_sharing_; }
  static sharing sharing_of(const rank_places& t);
  /// Whether this host has a CPU for each of its ranks (host_cpus(): those
  /// its launcher may use).
  bool cpu_per_rank() const;
  /// "world rank 3 (host h, pid 4711)".
  std::string describe(int r) const;
  /// The host world rank r runs on, by name (after connect(); the ranks of
  /// this process: this host).
  const std::string& host_of(int r) const;
  /// The link costs this rank's groups choose their algorithms by where its
  /// world measured them at start (TROUPE_LINK_COSTS's syntax; empty: the
  /// process's model). Set by the world before it makes its groups.
  void set_link_costs(std::string text) { link_costs_ = std::move(text); }
  const std::string& link_costs() const noexcept { return link_costs_; }
  /// The process id of world rank r (as it announced it when it joined).
  int pid_of(int r) const;
  /// Runs `use` on the bytes of world rank r that `l` names (a buffer it
  /// lent, or the receive buffer it asks this rank to help fill), mapped
  /// here once per buffer (memory/peer_memory.hpp); `op` ("recv", "send")
  /// and r are named in what it throws when they cannot be.
  void map_lent(int r, const p2p_loan& l, const char* op,
                const std::function<void(std::byte*)>& use);

  /// Sends collective data (the group actors' frames); a peer that takes
  /// nothing until `deadline` (the call's) is given up on, as send_inline:
  /// "", or why. `stall`, where given: what a write blocked long does first
  /// (base/write_stall.hpp).
  std::string send(int world_rank, const std::string& group, const envelope& env,
                   std::chrono::steady_clock::time_point deadline,
                   const write_stall* stall = nullptr);
  /// A point-to-point frame with no call's deadline (a loan's answer or
  /// withdrawal): given up on, the peer failed, after the world's timeout
  /// without room (a stopped peer holds no thread for ever).
  void send(int world_rank, const std::string& group, const p2p_envelope& env);
  /// A point-to-point frame written by the sender's thread (an eager send):
  /// "", or why not where the peer took nothing until `deadline`, the
  /// send's (it is then failed, as in send_inline); a peer that closed its
  /// connection is judged by the thread reading it, as before.
  std::string send(int world_rank, const std::string& group, const p2p_envelope& env,
                   std::chrono::steady_clock::time_point deadline);
  /// Sends a small frame without waiting, from a thread that must not wait
  /// (a reader of frames: two readers each waiting for the other to take
  /// its bytes would wait forever): written at once where the connection
  /// has room now, else by a callback-pool thread (base/callback_pool.hpp).
  void send_soon(int world_rank, const std::string& group, const p2p_envelope& env);
  /// Sends collective data for the inline engine of `group` in world rank's process.
  /// The calling thread may be the one reading its peers' sockets: while the
  /// connection cannot take more bytes it calls `while_full()` (which reads
  /// them), so two ranks sending to each other at once never wait on each
  /// other's full buffers.
  /// A peer that takes nothing until `deadline` is given up on (its
  /// connection is closed: the frame cannot be taken back half written, and
  /// the peer failed): "", or why it was given up on. `stall`, where
  /// given: what a write blocked long does first (base/write_stall.hpp).
  std::string send_inline(int world_rank, const std::string& group, const envelope& env,
                          const std::function<void()>& while_full,
                          std::chrono::steady_clock::time_point deadline,
                          const write_stall* stall = nullptr);

  /// Where inline frames for `group` go (called on the thread that read
  /// them); answers why it refuses the frame ("": taken), which fails the peer.
  using inline_sink = std::function<std::string(received_frame&)>;
  /// Where the payload of an inline frame for `group` may be read to (a
  /// receive posted in advance, frame.hpp), asked before it is read.
  using inline_place = std::function<posted_receive(const frame_header&)>;
  /// `members[r]`: the world rank of group rank r (frames are checked against them).
  void add_sink(const std::string& group, const std::vector<int>& members, inline_sink sink,
                inline_place place = {});
  void remove_sink(const std::string& group);

  /// Whether frames from world rank `r` arrive over its TCP connection (not
  /// through shared memory), so that pump() can read them.
  bool reads_socket(int r) const;
  /// Whether pump() can read world rank r's frames (a TCP connection or a
  /// shared-memory ring).
  bool pumpable(int r) const;
  /// Reads what world rank r's connection has, without blocking, and
  /// dispatches it (skipped while another thread reads it); true when a frame
  /// arrived.
  bool pump(int r);
  /// pump() for each of the world ranks `ranks`: their rings looked at in
  /// memory, their sockets asked in one poll and only those with bytes read
  /// (a rank waiting on many peers pays one system call a look, not one a
  /// peer); true when a frame arrived.
  bool pump_all(const std::vector<int>& ranks);
  /// A thread starts (+1) or stops (-1) pumping r's connection; while one
  /// does, the reader thread parks. Stopping with `wake` (the thread still
  /// waits, asleep) resumes it at once; without, a socket's reader stays
  /// parked for reading_linger (the next call is likely to pump again).
  void pumping(int r, int delta, bool wake);
  /// Why world rank r is gone (empty while it is connected).
  std::string gone_reason(int r);
  /// Why world rank r failed (its connection ended without a goodbye or was
  /// dropped for bad frames); empty while it did not.
  std::string crash_reason(int r);
  /// How many peers failed so far; shared, so that an inline engine checks it with
  /// one load while the data plane may already be gone.
  std::shared_ptr<const std::atomic<std::uint32_t>> crashed() const noexcept { return crashes_; }
  /// Set once this process sent or received a point-to-point message
  /// through the plane (shared, as crashed()): from then on threads that wait
  /// for collectives read the peers' rings too (shm_medium).
  std::shared_ptr<const std::atomic<bool>> carried_p2p() const noexcept { return p2p_seen_; }
  /// The point-to-point messages so far were the world's own, every one
  /// taken in (its link measurement at start): collectives need not read
  /// the rings for them (the measurement does not change how a user's
  /// collectives wait).
  void forget_p2p() noexcept { p2p_seen_->store(false, std::memory_order_relaxed); }
  /// Fails world rank r as if it died, naming `why` (its frames broke a rule
  /// checked above the data plane): its connections close.
  void reject(int r, const std::string& why);

  /// Where collective and point-to-point frames for a group go (the group's
  /// group actor: actors/plane_sink.hpp), and who hears that a peer is gone.
  struct group_sink {
    std::function<void(envelope)> collective;
    std::function<void(p2p_envelope)> p2p;
    /// World rank `r` is gone: `crashed` (died, broke its connection, sent
    /// bad frames) or left with a goodbye; `why` names it.
    std::function<void(int r, const std::string& why, bool crashed)> gone;
    /// Where the payload of a point-to-point frame may be read to (a receive
    /// posted for it), asked before it is read; may be empty.
    inline_place p2p_place;
    /// What a loan needs said (p2p_envelope::lent, returned, withdrawn: the
    /// mailbox's). Empty on the group actors' path (TROUPE_ENGINE=actors in
    /// this process only): a lent message is then copied here into a
    /// message of its own, its loan returned at once.
    std::function<void(p2p_envelope)> loan;
  };
  /// Routes frames for `group` to `sink` (and tells it about peers that
  /// die, also those that died before).
  void add_group(const std::string& group, const std::vector<int>& members, group_sink sink);
  void remove_group(const std::string& group);

  /// Connections refused for a bad handshake so far.
  std::uint64_t refused() const noexcept { return refused_.load(); }
  /// Reader threads running now (one per connected peer at most).
  std::size_t reader_threads();
  /// The listening port (0 when every rank lives in this process).
  std::uint16_t port() const noexcept { return port_; }
  /// Writes raw bytes on the connection to world rank r, as they are: for
  /// tests and the frame fuzzer, which play a peer that breaks the rules.
  bool send_raw(int r, const void* data, std::size_t n);
  /// Holds the connection from world rank r as a thread that reads it does
  /// (no other thread reads it until the lock is released): for tests, which
  /// play a reader the host starves of CPU in the middle of a frame.
  std::unique_lock<std::mutex> hold_reading(int r);

 private:
  /// Writes a frame to world rank r (`write_to(stream)`), giving up at
  /// `deadline` while its connection takes nothing (then closed, and r
  /// failed); why where it gave up so, else "" (written, or r gone: the
  /// calls that wait for r learn why it left).
  /// Defined in data_plane_send.cpp, its only user.
  /// What send_until does when a write fails on a connection its peer
  /// closed: fail the peer (the inline engine's frames), or leave it to the
  /// thread that reads that connection, which reads a goodbye first and so
  /// blames the rank whose failure made the peer leave (the group actors'
  /// and point-to-point frames: such a write is not a failure of the send).
  /// A write that took nothing until its deadline fails the peer either way.
  enum class on_write_error { fail_peer, leave_to_reader };
  template <class Write>
  std::string send_until(int world_rank, const Write& write_to,
                         const std::function<void()>& while_full,
                         std::chrono::steady_clock::time_point deadline, on_write_error errors,
                         const write_stall* stall = nullptr);
  struct peer;
  struct route;
  /// How write_bounded ended, and why where it did not write.
  struct write_outcome {
    enum class ended { written, closed, failed, timed_out };
    ended how = ended::written;
    std::string why;
  };
  /// Writes with `write_to` to p's connection (the caller holds p.out_mtx),
  /// giving up at `deadline` while it takes nothing, then closing it; a
  /// write still blocked stall->after into it calls stall->tell once
  /// (data_plane_send.cpp, its only user).
  template <class Write>
  static write_outcome write_bounded(peer& p, const Write& write_to,
                                     const std::function<void()>& while_full,
                                     std::chrono::steady_clock::time_point deadline,
                                     const write_stall* stall = nullptr);
  peer& at(int r) const { return peers_.empty() ? *local_ : *peers_[static_cast<std::size_t>(r)]; }
  void accept_loop();
  /// A stranger's hello is complete: adopt its connection or refuse it.
  void adopt(int fd, const std::string& who, const hello& h);
  void refuse(const std::string& who, const std::string& why);
  /// Runs f on a reader thread named `name` (joined once it ended); false
  /// when none can start.
  bool spawn(const std::string& name, std::function<void()> f);
  void reclaim_threads();
  void close_once();
  /// When the calling thread reads for `plane`: marks it detached and says
  /// where it keeps the plane alive until it ends; else nullptr.
  static std::shared_ptr<data_plane>* detach_reader(const data_plane* plane);
  /// The reader thread of `rank`'s incoming connection (socket or ring).
  void reader_loop(int rank);
  /// How long a socket's reader thread stays parked before it looks again
  /// (0: it reads): while a thread pumps the socket, and for reading_linger
  /// after the last one stopped without handing it over.
  static std::chrono::nanoseconds parked_for(const peer& p);
  static constexpr std::chrono::milliseconds reading_linger{2};
  /// The failure detector (data_plane_heartbeat.cpp): every opts_.heartbeat,
  /// a heartbeat to every peer process, and the ranks of a peer process
  /// silent for opts_.unresponsive failed.
  void heartbeat_loop();
  /// Writes a heartbeat to `p` unless that would wait; whether it did.
  bool beat(peer& p);
  /// Checks a frame from rank r before its payload is read (frame.hpp's admit_fn).
  std::string admit(int r, const frame_header& h, const std::string& group, bool& skip);
  /// Hands a frame from rank r to its group; false after a goodbye or when
  /// the frame was refused (`refusal` says why).
  bool dispatch(int r, received_frame& f, std::string& refusal);
  /// Reads r's socket until it has nothing more (the caller holds in_mtx).
  bool drain(int r, bool& any);
  /// Reads what waits on r's connection, without waiting (`any`: a frame
  /// that is not a heartbeat came); false when another thread reads it now.
  bool try_drain(int r, bool& any);
  /// Whether bytes r sent wait unread on its connection (taking no lock):
  /// r spoke, whoever has not read it yet.
  bool unread_from(int r);
  /// Rank r is gone: `crashed` (died, broke its connection, sent bad frames:
  /// its groups fail) or left with a goodbye; `cause`: the world rank it
  /// blamed (-1: none); `kind`: how the rank this one's goodbye will blame
  /// failed (r itself when crashed, else `cause`).
  void peer_gone(int rank, const std::string& why, bool crashed, int cause = -1,
                 failure_kind kind = failure_kind::failed);
  /// Before this rank closes its connection to a live peer (a write that
  /// took nothing until its deadline, or a verdict on the peer): `why`,
  /// sent back on the peer's own connection to this rank, once
  /// (data_plane_peers.cpp).
  static void leave_note(peer& p, const std::string& why);
  /// What peer r said as it closed its connection to this rank (leave_note),
  /// looked for on this rank's connection to it for a moment; "" where it
  /// said nothing (it died: that connection ended too).
  std::string read_note(int r);
  void set_route(const std::string& group, const std::function<void(route&)>& change);
  /// Writes a goodbye to p (the caller holds p.out_mtx), waiting a second
  /// at most for room (data_plane_send.cpp).
  void say_goodbye(peer& p, std::int32_t cause, failure_kind kind);
  /// A loan from world rank r for a group without a loan sink (group_sink::loan):
  /// copies the lent bytes into a message, returns the loan and delivers it.
  void take_loan(int r, const std::string& group, const route& rt, p2p_envelope env);
  data_plane_options opts_;
  /// How long ring readers look for bytes before sleeping (shm_ring::wait_readable);
  /// set by connect() before any reader starts.
  std::chrono::microseconds ring_linger_{0};
  // Every rank of this process (and, until connect() tells them apart,
  // every rank) shares local_; peers_ is filled, by world rank, only when
  // ranks live in other processes: n records in each of n ranks of a
  // simulation would be n^2.
  std::shared_ptr<peer> local_;
  std::vector<std::shared_ptr<peer>> peers_;
  std::shared_ptr<const rank_places> places_;  // where every rank runs (shared in this process)
  std::shared_ptr<void> places_slot_;          // where the ranks of this process find it
  int remote_count_ = 0;
  int host_ranks_ = 0;  // ranks on this host, this one included
  sharing job_sharing_;
  std::string link_costs_;
  int listen_fd_ = -1;
  std::uint16_t port_ = 0;
  int wake_[2] = {-1, -1};  // wakes the accepting thread when the plane stops
  std::atomic<bool> stopping_{false};
  std::once_flag closed_;
  std::atomic<std::uint64_t> refused_{0};
  std::shared_ptr<std::atomic<std::uint32_t>> crashes_ =
      std::make_shared<std::atomic<std::uint32_t>>(0);
  std::shared_ptr<std::atomic<bool>> p2p_seen_ = std::make_shared<std::atomic<bool>>(false);
  /// Sets p2p_seen_ (a store only the first time: its line stays shared).
  void note_p2p() noexcept {
    if (!p2p_seen_->load(std::memory_order_relaxed))
      p2p_seen_->store(true, std::memory_order_relaxed);
  }
  // The first rank known to have failed, blamed in goodbyes: its world rank
  // times 256 plus how it failed (a failure_kind); -1: none.
  std::atomic<int> first_cause_{-1};
  std::mutex mtx_;  // guards routes_, threads, connected_, gone_why
  std::condition_variable connected_cv_;
  int connected_ = 0;
  std::map<std::string, std::shared_ptr<const route>> routes_;
  std::atomic<std::uint64_t> routes_version_{1};  // bumped by every change of routes_
  std::thread acceptor_;
  std::thread heart_;  // heartbeat_loop
  // Every process peer connected to this one (connect's step 4): from then
  // on heartbeat_loop listens, not only beats.
  std::atomic<bool> listening_{false};
  std::mutex heart_mtx_;
  std::condition_variable heart_cv_;              // wakes heartbeat_loop when the plane stops
  std::map<std::uint64_t, std::thread> readers_;  // running or finished, not yet joined
  std::vector<std::uint64_t> finished_;           // readers that ended
  std::uint64_t next_reader_ = 0;
  // Refusals logged per second at most (a flood must not flood stderr too).
  std::chrono::steady_clock::time_point log_window_{};
  int logged_ = 0;
  std::uint64_t unlogged_ = 0;
  std::mutex lent_mtx_;  // guards lent_ (map_lent)
  std::unique_ptr<peer_memory> lent_;
};

}  // namespace troupe::detail
