#pragma once
// message_medium — the inline engine's medium of messages: operations (algorithm_op)
// send from the thread that drives them, and what arrives lands in the
// group's inbox.
//  - Ranks in this process: the message is handed straight into the peer's
//    inbox (found in a process-wide directory; the tensor is shared, never
//    copied). A peer whose group is gone is lost.
//  - Ranks in other processes: frames through the data plane (TCP or the
//    shared-memory rings). They are put into the inbox by the waiting thread
//    itself (pump: it reads the peers' connections; operations up to 1 MiB,
//    where latency counts, and at any size its host peers' shared-memory
//    rings, whose reader threads run at the lowest priority) or by the data
//    plane's reader threads (larger operations' sockets: a thread that sends
//    while another receives moves 2.5 GB/s each way, one thread doing both
//    1.7). A peer is lost when the data plane says its process is gone.
// Arrival handlers (on_arrival): an operation may ask that one of its
// messages be consumed by the thread that delivers it (a reader thread
// reduces a segment while the bytes are in its cache and the waiting thread
// sends); the inbox then gets a "consumed" marker. end_op drops an
// operation's handlers and waits for running ones, before its caller hears.
// Posted receives (post_receive): an operation may name the tensor a message
// from another process belongs in (a slice of its output); the data plane
// then reads the payload straight into it, and placing it there copies
// nothing. end_op revokes what it posted: from then on no byte is written
// there, even by a frame being read at that moment.
// Bounds: a peer in another process may have at most max_waiting_messages
// messages waiting here, and max_early_bytes of payload for operations after
// the next one (transport/frame.hpp); a frame beyond them is refused, which
// fails that peer. A peer process that died fails every operation (lost()),
// not only those blocked on it.

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "algorithms/topology.hpp"
#include "base/rank_names.hpp"
#include "base/write_stall.hpp"
#include "inline/medium.hpp"
#include "transport/frame.hpp"
#include "troupe/tensor.hpp"

namespace troupe::detail {

class data_plane;
struct envelope;

class message_medium final : public medium, public std::enable_shared_from_this<message_medium> {
 public:
  /// One message of an operation, as it arrived.
  struct message {
    std::uint8_t code = 0;  ///< the sender's collective (op_code)
    tensor payload;
    bool consumed = false;     ///< an arrival handler took the payload
    std::exception_ptr error;  ///< what that handler threw
    fingerprint_ptr fp;        ///< what the sender called (on its first message of a call)
    std::uint64_t early = 0;   ///< payload bytes counted against max_early_bytes
  };
  using arrival_fn = std::function<void(const tensor&)>;

  /// `key` names this group of this job in the process (ranks of one process
  /// find each other's inbox under key + rank); `local[r]`: rank r lives in
  /// this process. `plane` may be null when every rank is local.
  message_medium(std::shared_ptr<data_plane> plane, std::string key, std::vector<bool> local,
                 std::vector<int> global_ranks, int rank, std::string group, rank_names names);
  ~message_medium() override;
  /// Starts receiving (before any peer may send).
  void attach();
  bool is_local(int r) const { return local_[static_cast<std::size_t>(r)]; }
  /// Whether a thread that reads `what` itself reads group rank r's
  /// messages (a peer in another process; reading::host: one whose memory
  /// this rank shares, through a ring).
  bool reads_from(int r, reading what) const {
    return what == reading::all || (what == reading::host && ringed_[static_cast<std::size_t>(r)]);
  }

  int size() const noexcept override { return static_cast<int>(global_ranks_.size()); }
  int rank() const noexcept { return rank_; }
  /// Where the group's ranks live (their hosts, from the data plane).
  const std::shared_ptr<const group_topology>& topology() const noexcept { return topology_; }
  /// Whether large transfers to group rank r go in paced segments
  /// (op_context::paced): r lives on another host, and this host has a CPU
  /// for each of its ranks.
  bool paced(int r) const {
    return own_cpus_ && topology_->host_of[static_cast<std::size_t>(r)] !=
                            topology_->host_of[static_cast<std::size_t>(rank_)];
  }
  bool pump(reading what) override;
  /// A large call's waiting thread reads its host peers' rings only where
  /// this host has a CPU for each of its ranks: where ranks share CPUs, a
  /// waiting thread that polls the rings holds the CPU the peer that fills
  /// them needs (2 emulated hosts of 2 ranks on a CPU each: a 64 MiB
  /// allreduce 92 ms with the reader threads, 260-360 with the waiting
  /// threads reading).
  reading reads_while_waiting(reading wanted) override {
    if (wanted == reading::host && (ring_peers_.empty() || !own_cpus_)) return reading::none;
    return wanted;
  }
  /// Whether this process sends or receives point-to-point messages
  /// through the data plane (data_plane::carried_p2p).
  bool carries_p2p() const noexcept {
    return p2p_seen_ && p2p_seen_->load(std::memory_order_relaxed);
  }
  /// Starts (+1) or stops (-1) pumping the connections of the peers `what`
  /// names; stopping with `wake` hands them back to the reader threads at
  /// once.
  void pumping(int delta, bool wake, reading what);
  void begin_wait(reading reads) override;
  void end_wait(reading reads) override;
  void sleep(int r, std::chrono::nanoseconds max, const std::function<bool()>& recheck,
             reading reads) override;
  /// Members in other processes the data plane found crashed, dead or
  /// unresponsive, as lost() names them ("" while none): one load while no
  /// peer failed. The shared-memory engine beside this one asks it too.
  std::string crashed() {
    if (!crashes_ ||
        crashes_->load(std::memory_order_relaxed) == crashes_seen_.load(std::memory_order_relaxed))
      return {};
    return crashed_members();
  }
  /// Whether crash_grace (base/gone_peers.hpp) passed since a look first
  /// found a member crashed (crashed() not empty): until then operations
  /// wait on; then every member found crashed is named.
  bool crash_settled(std::chrono::steady_clock::time_point now);
  std::string lost(std::uint64_t op, int blocker,
                   std::chrono::steady_clock::time_point now) override;
  /// Why group rank r left, as its goodbye told the data plane ("it left
  /// the job after rank 2 (...) was found unresponsive ..."); "" when not
  /// known (yet).
  std::string left_reason(int r);
  void wake_all() override;
  void leave() override;

  /// Sends step `step` of inline operation `op` to group rank `peer` (with
  /// the sender's fingerprint `fp` on its first message of the operation),
  /// giving up on a peer that takes nothing until `deadline`: "", or why it
  /// was given up on (the peer is failed). A sender that reads its peers'
  /// connections itself (`reads`) keeps reading them while the connection
  /// is full; one blocked long first runs `stall` (base/write_stall.hpp).
  std::string send(int peer, std::uint64_t op, std::uint32_t step, std::uint8_t code,
                   const tensor& payload, std::chrono::steady_clock::time_point deadline,
                   reading reads, const fingerprint_ptr& fp = nullptr,
                   const write_stall* stall = nullptr);
  /// Has the message (op, step, src) handed to `fn` by the thread that
  /// delivers it (a reader thread), if it is of collective `code`; the inbox
  /// then gets a consumed message in its place (with `fn`'s exception).
  /// False when it already arrived.
  bool on_arrival(std::uint64_t op, std::uint32_t step, int src, std::uint8_t code, arrival_fn fn);
  /// Has the payload of message (op, step, src) from another process read
  /// straight into `into` when it is of collective `code` and exactly
  /// `into`'s bytes and dtype (a contiguous host tensor that nothing else
  /// writes, and no pending send reads, until the message was taken).
  void post_receive(std::uint64_t op, std::uint32_t step, int src, std::uint8_t code,
                    const tensor& into);
  /// Where the payload of the frame with header `h` goes (what post_receive
  /// posted for it, handed out once), or nothing; asked by the data plane.
  posted_receive placement(const frame_header& h);
  /// Operation `op` ended (operations end in the order they were issued):
  /// drops its handlers, waits for running ones, revokes its posted
  /// receives and drops what it never took, and what arrives for it later.
  void end_op(std::uint64_t op) override;
  /// Takes every message of operation `op` that arrived: fn(src, step, message).
  template <class F>
  void take_all(std::uint64_t op, F&& fn) {
    std::vector<std::tuple<int, std::uint32_t, message>> got;
    {
      std::lock_guard<std::mutex> g{mtx_};
      auto it = inbox_.lower_bound({op, 0, 0});
      while (it != inbox_.end() && std::get<0>(it->first) == op) {
        uncount(std::get<2>(it->first), it->second);
        got.emplace_back(std::get<2>(it->first), std::get<1>(it->first), std::move(it->second));
        it = inbox_.erase(it);
      }
    }
    for (auto& [src, step, m] : got) fn(src, step, m);
  }

 private:
  /// Why a frame from another process is refused ("": taken).
  std::string deliver(received_frame& f);
  std::string deliver(std::uint64_t op, std::uint32_t step, int src, message m);
  /// Counts a message into the inbox (under mtx_); why it may not wait there.
  std::string count(std::uint64_t op, int src, message& m);
  void uncount(int src, const message& m);
  /// Why the group can never finish an operation: members whose process died.
  std::string crashed_members();
  /// The inbox of local rank r (null once its group is gone).
  std::shared_ptr<message_medium> local_peer(int r);
  const std::vector<int>* pumped(reading what) const;

  // Not owned: a reader thread may drop the last reference to this medium,
  // and must not destroy the data plane (which joins that thread) with it.
  std::weak_ptr<data_plane> plane_;
  std::string key_;
  std::vector<bool> local_;
  std::vector<std::weak_ptr<message_medium>> peers_;  // local ranks' media, found once
  std::vector<int> global_ranks_;
  std::shared_ptr<const group_topology> topology_;
  bool own_cpus_ = false;  // this host's ranks have a CPU each (paced)
  int rank_;
  std::string group_;
  rank_names names_;
  std::vector<int> remote_;  // world ranks of the peers in other processes
  // Of those, the peers whose memory this rank shares (rings, unless a
  // peer's memory closed later: then its socket, read alike).
  std::vector<int> ring_peers_;
  std::vector<bool> ringed_;                                  // by group rank: in ring_peers_
  using key = std::tuple<std::uint64_t, std::uint32_t, int>;  // (op, step, src)
  std::mutex mtx_;                                            // guards inbox_, handlers_, running_
  std::map<key, message> inbox_;
  std::map<key, std::pair<std::uint8_t, arrival_fn>> handlers_;  // code expected, handler
  struct posted {
    std::uint8_t code;
    posted_receive where;
    bool handed_out = false;
  };
  std::map<key, posted> posted_;
  std::uint64_t ended_ = 0;  // every operation up to this one ended (inline engine's order)
  std::multiset<std::uint64_t> running_;  // ops whose handlers run now
  std::condition_variable idle_;          // a handler finished
  struct waiting {
    std::size_t messages = 0;
    std::uint64_t early = 0;
  };
  std::vector<waiting> waiting_;  // by sender (under mtx_)
  // The data plane's count of failed peers, and the count at the last
  // look that found no member among them (lost() runs under the inline engine's lock).
  std::shared_ptr<const std::atomic<std::uint32_t>> crashes_;
  std::atomic<std::uint32_t> crashes_seen_{0};         // asked by the engines beside it too
  std::atomic<std::int64_t> crash_found_ns_{0};        // crash_settled's first look
  std::shared_ptr<const std::atomic<bool>> p2p_seen_;  // the data plane's carried_p2p()
  std::atomic<std::uint32_t> bell_{0};
  std::atomic<std::uint32_t> sleepers_{0};
};

}  // namespace troupe::detail
