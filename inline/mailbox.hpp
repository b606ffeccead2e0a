#pragma once
// mailbox — point to point beside the inline engine: send, recv and
// recv_any_source run in the threads that issue and wait for them, without
// an actor hop (the hops to the group actors and back to the work would cost
// a 4-byte message tens of microseconds).
//  - Matching is c10d's: per (source, tag) in the order sent; recv_any_source
//    takes the first message with its tag from any rank and reports the
//    sender. A receive posted first is matched by the message when it
//    arrives; a message that arrives first waits in the receiver's mailbox.
//  - Ranks of this process: the sender's thread matches in the receiver's
//    mailbox and copies straight into the posted buffer (one copy; the
//    receiver, polling its work, sees it finish within its spin). Unmatched,
//    a message up to eager_bytes is copied and the send completes; a larger
//    one is lent: the receiver copies from the sender's buffer when its
//    receive comes, and the send completes then (as Gloo's and NCCL's sends
//    wait for their receive). From split_bytes, between contiguous buffers,
//    the thread that copies shares the copy, chunk by chunk, with the
//    threads waiting for the send and the receive (kernels/shared_copy.hpp;
//    a helper holds it up by one chunk at most, so also with more ranks
//    than CPUs).
//  - Ranks of other processes: a frame through the data plane (shared-memory
//    ring or TCP), written by the sender's thread (sends are eager); in the
//    receiving process the reader thread, or the waiting thread itself
//    reading a TCP peer's socket, matches it on arrival.
//  - Large messages to ranks of other processes on this host (lend_bytes and
//    more, from a buffer peers can map: tensor::empty_shared, or a reused
//    tensor::empty buffer moved into shared memory in place) are lent: a
//    frame says where the bytes are (p2p_loan), the receiving rank copies
//    them once, straight from the sender's buffer into its receive's
//    (memory/peer_memory.hpp maps it), and returns the loan; the send
//    completes then (through the ring each byte was copied twice, three
//    times when the message came before its receive). From split_bytes, and
//    when the receive buffer can be shared too, the two copy it together:
//    the receiver asks the lender for help (naming its buffer), copies the
//    first half while the lender's thread, which waits for the loan anyway,
//    copies the second straight into the receive buffer; the receive
//    completes and the loan returns when both halves are in (a lender that
//    cannot help says why, and the receiver copies the rest). A loan the receiver
//    cannot take comes back with why, and the send fails with it. At its
//    deadline a loan is withdrawn, and the receiver decides: a message it
//    took completes the send, one it had not is dropped there and the send
//    fails (timeout), so that no receive takes it later; a receiver that
//    answers neither within another timeout fails it too. Abort, destroying
//    the group and the receiver's death fail loans at once.
//  - Failures: every receive and lent send has a deadline, watched by one
//    process-wide timer thread, so that an operation nobody waits for still
//    ends; a peer that left fails what waits for it (what it sent before
//    still matches); a peer process that crashed, abort and destroying the
//    group fail everything pending and every later call; a receive whose
//    buffer does not fit the message fails naming both sizes and dtypes.
//  - Callbacks: a receive is completed by the sender's thread (one process),
//    a reader of the peer's frames or the timer; its callbacks (on_complete,
//    then) run on the callback pool (base/callback_pool.hpp), so that one
//    that waits for that sender's next message does not wait for itself.
//  - Bounds: a peer in another process may have at most max_waiting_messages
//    unmatched messages, max_early_bytes in all, waiting here; more fails
//    that peer (transport/frame.hpp). A rank of this process past the same
//    bounds lends its small messages too: its sends wait for their receive.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/arrival_queue.hpp"
#include "base/call.hpp"
#include "base/gone_peers.hpp"
#include "base/one_or_more.hpp"
#include "base/rank_names.hpp"
#include "base/spin_lock.hpp"
#include "base/work_driver.hpp"
#include "transport/frame.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

class data_plane;

class mailbox : public std::enable_shared_from_this<mailbox> {
 public:
  using clock = std::chrono::steady_clock;
  /// Unmatched messages to a rank of this process up to this size are copied
  /// (the send completes at once); larger ones are lent until a receive takes them.
  static constexpr std::size_t eager_bytes = 64 << 10;
  /// Messages to ranks of other processes on this host from this size are
  /// lent (when their buffer can be shared), smaller ones copied through the ring.
  static constexpr std::size_t lend_bytes = 256 << 10;
  /// Lent messages from this size are copied by both ends (above), when the
  /// receive buffer is contiguous and can be shared, and the job's ranks on
  /// this host do not outnumber its CPUs (a lender waiting for a CPU would
  /// hold the receive up). Below this size a message is in cache and one
  /// copy is quick: the extra round trip to the lender costs more than the
  /// split saves. From it on, the split takes about half the time.
  static constexpr std::size_t split_bytes = 1 << 20;

  /// `key` names this group of this job in the process (ranks of one process
  /// find each other's mailbox under key + rank); `global_ranks[r]`: the
  /// world rank of group rank r; `plane` null when every rank is in this process.
  mailbox(std::string key, std::string group, int rank, std::vector<int> global_ranks,
          std::shared_ptr<data_plane> plane);
  ~mailbox();
  /// Publishes this mailbox for the ranks of this process (before any peer may send).
  void attach();
  /// How the errors name each group rank ("rank 1 (world rank 1)").
  void set_names(rank_names names);

  /// Issues a send or a receive; `c.handle` completes when it is done (a
  /// receive with `c.count`: when it and the others counted with it are).
  void post(p2p_call c);
  /// Whether group rank `peer` is a rank of another process.
  bool in_other_process(int peer) const { return !local_[static_cast<std::size_t>(peer)]; }
  /// A send of fewer than `below` bytes to a rank of another process goes
  /// out now (eager: written before this returns; `c.handle` is not used):
  /// true when it did, or failed (then `failed` says why); false when it is
  /// not such a send (post it).
  bool send_now(const p2p_call& c, std::exception_ptr& failed, std::size_t below = lend_bytes);
  /// While this thread issues a batch (+1 ... -1): it counts as polling the
  /// shared-memory rings of the peers in other processes, so that a frame
  /// that comes meanwhile wakes no reader thread; at -1 it reads what came
  /// (into the receives it just posted).
  void issuing(int delta);
  /// A message from a rank in another process (the data plane's reader, or a
  /// thread reading a peer's socket or ring).
  void arrive(p2p_envelope env);
  /// What a loan needs said, from a rank in another process (lent, returned,
  /// withdrawn: base/call.hpp's p2p_envelope).
  void loan(p2p_envelope env);
  /// Where the payload of the frame with header `h` goes: the buffer of the
  /// receive it will match when it fits exactly (then arrive() copies
  /// nothing), else nothing. Asked by the data plane before it reads it.
  posted_receive place(const frame_header& h);
  /// World rank `world_rank` is gone: `crashed`, or left (goodbye); `why` says how.
  void gone(int world_rank, const std::string& why, bool crashed);
  /// Fails everything pending and every later call with `reason`.
  void abort(errc code, const std::string& reason);
  /// This rank destroys the group: fails what is pending, and tells the
  /// peers of this process that it left.
  void leave(const std::string& reason);
  /// Fails what passed its deadline (the timer thread).
  void expire();

 private:
  struct receive {
    p2p_call call;
    clock::time_point deadline;
  };
  struct message {
    int src = 0;
    int tag = 0;
    tensor payload;
    bool remote = false;   // from another process: past the bounds its sender is failed
    bool counted = false;  // held here, counted in waiting_ (remote, or copied eagerly)
    // A lent message: `payload` is the sender's buffer and this its send,
    // completed (or failed: see `lent`) when a receive took it.
    work sender;
    /// What a lent message's send fails with (with `sender` alone); kept
    /// apart, so that the messages that are not lent move light.
    struct lender {
      std::string where;
      std::string waits_for;
      std::chrono::milliseconds timeout{};
      clock::time_point deadline;
    };
    std::unique_ptr<lender> lent;
    // Lent by a rank of another process: the bytes are in its buffer, copied
    // by fill(), which then returns the loan.
    std::optional<p2p_loan> loan;
  };
  /// A message this rank lent to a rank of another process, until the loan
  /// comes back (or the send fails).
  struct lent_send {
    std::uint64_t id;
    p2p_call call;
    clock::time_point deadline;
    // Past its deadline: withdrawn, and waiting (until the new deadline)
    // for the receiver to say whether it took the message before; the
    // send's failure if it did not.
    std::exception_ptr withdrawn;
  };
  struct finish {  // what to complete or fail once the lock is released
    finish(std::optional<receive> rr, std::optional<message> mm, std::exception_ptr e)
        : r(std::move(rr)), m(std::move(mm)), error(std::move(e)) {}
    /// A receive and the message it takes, moved in once each.
    finish(receive&& rr, message&& mm) : r(std::move(rr)), m(std::move(mm)) {}
    finish(lent_send l, std::exception_ptr e, bool withdrawn)
        : error(std::move(e)), lent(std::move(l)), withdraw(withdrawn) {}
    std::optional<receive> r;
    std::optional<message> m;
    std::exception_ptr error;       // for r (or, without r, for m's sender or loan)
    std::optional<lent_send> lent;  // completes (error: fails) this lent send
    bool withdraw = false;          // and withdraws its loan from the receiver
  };
  /// The finishes of one step: mostly one.
  using finishes = one_or_more<finish>;
  /// A lent message copied by both ends (split_bytes), from the request for
  /// help until both halves are in: the receiver copies [0, at), the lender
  /// the rest.
  struct split {
    receive r;
    message m;
    std::size_t at = 0;
    bool own_done = false;              // this rank's half is in
    std::exception_ptr own_error;       // copying it failed
    std::optional<std::string> helped;  // the lender's answer: "" copied, else why not
    bool withdrawn = false;             // the lender gave the loan up meanwhile
  };

  /// A tensor's bytes (0 when undefined).
  static std::size_t bytes_of(const tensor& t);
  /// What `e` says (a loan's refusal carries it back to the lender).
  static std::string text_of(const std::exception_ptr& e);
  // The loans (inline/mailbox_loans.cpp).
  /// Lends `c` to its receiver in another process (true), or false when it
  /// is to be copied through the connection (small, or a buffer peers cannot map).
  bool lend(p2p_call& c, data_plane& plane);
  /// Tells rank `src` that its loan `id` was taken (`why` empty) or why not.
  void answer(int src, std::uint64_t id, const std::string& why) const;
  /// Tells rank `peer` that this rank's loan `id` is withdrawn (its send failed).
  void withdraw(int peer, std::uint64_t id) const;
  /// Copies bytes [from, from + count) of the message rank `src` lent (`l`)
  /// into the same bytes of `buf` (throws when its buffer cannot be mapped).
  /// A part of the message needs a contiguous `buf` (a strided one takes it whole).
  void take(int src, const p2p_loan& l, const tensor& buf, std::size_t from,
            std::size_t count) const;
  /// Starts copying lent message `m` into `r`'s buffer together with its
  /// lender (split); false when it cannot be split (too small, a buffer that
  /// cannot be shared): then this rank copies it whole.
  bool start_split(receive& r, message& m);
  /// What happened to the split of loan `id` from `src` (`change`, under
  /// mtx_): finishes it once this rank's half is in and the lender answered
  /// or withdrew.
  void split_step(int src, std::uint64_t id, const std::function<void(split&)>& change);
  /// Ends a split that left splits_: the receive completes and the loan
  /// returns, or both fail (outside the lock).
  void end_split(split& s);
  /// The lender's side of a split: copies the part loan request `h` asks
  /// for into the receiver's buffer, and answers.
  void help(const p2p_envelope& h);
  /// Takes a message from a peer: hands it to the first matching receive, or keeps it.
  void accept(message m);
  /// Takes a small message from a rank of this process: hands it to the
  /// first matching receive, or keeps a copy (the send may complete) —
  /// unless its sender has the bound waiting here already: false, `m`
  /// untouched, and the sender lends it instead.
  bool accept_eager(message& m);
  /// The first posted receive a message from `src` with `tag` matches (under mtx_).
  arrival_queue<receive>::iterator first_receive(int src, int tag);
  /// Copies `m` into `r`'s buffer and completes both (outside the lock).
  void fill(receive& r, message& m);
  void settle(finishes& done);
  /// Receive `c` came into `buf` from `src`: its work completes, or its
  /// count goes down (the last completes the batch's).
  static void received(p2p_call& c, const tensor& buf, int src);
  std::shared_ptr<mailbox> local_peer(int r);
  std::shared_ptr<mailbox> local_peer_locked(int r);  ///< under mtx_
  std::string where(const std::string& op) const;
  std::string name_of(int r);
  /// `r` fails with `cause`, once the lock is released.
  void fail_into(finishes& done, receive r, errc code, const std::string& cause) const;
  /// Fails everything pending (under mtx_) into `done`.
  void fail_all(errc code, const std::string& reason, finishes& done);
  /// The timeout error of receive `c` (under mtx_).
  std::exception_ptr timed_out(const p2p_call& c) const;
  /// Makes sure the timer calls expire() by `deadline` (under mtx_).
  void arm(clock::time_point deadline);
  /// Reads peer sockets in the waiting thread until `s` finished (TCP peers).
  void pump_for(struct work_state& s, clock::time_point until, const std::vector<int>& peers);
  /// What a thread waiting for a message from `peer` (-1: any rank), or for
  /// the return of a loan to it, reads itself: the sender's connection
  /// (socket or ring) and every peer's ring (an empty one costs two loads);
  /// made once per peer.
  struct pumping_plan final : work_driver {
    std::weak_ptr<mailbox> self;
    std::vector<int> connections;  // world ranks
    void drive(work_state& s, clock::time_point until) const override;
  };
  /// Makes waiting for `w` read the connections of `peer`'s plan, if any.
  void drive_by_pumping(const work& w, int peer);

  std::string key_;
  std::string group_;
  int rank_;
  std::vector<int> global_ranks_;
  bool ranks_sorted_ = false;        // global_ranks_ ascending (base/group_ranks.hpp)
  std::weak_ptr<data_plane> plane_;  // not owned: a reader thread may hold the last reference
  std::vector<bool> local_;
  spin_lock mtx_;  // guards everything below (held for short steps only)
  rank_names names_;
  std::vector<std::weak_ptr<mailbox>> peers_;  // local ranks' mailboxes, found once
  // Taken mostly from the front, in O(1) however long (base/arrival_queue.hpp);
  // their memory is kept between calls.
  arrival_queue<receive> receives_;  // posted, in post order
  arrival_queue<message> messages_;  // arrived, unmatched, in arrival order
  struct waiting {
    std::size_t messages = 0;
    std::uint64_t bytes = 0;
  };
  std::vector<waiting> waiting_;  // per sender: its messages held here (counted)
  // Per sender in another process: the receive its frame being read now
  // goes into (place()), and whether that frame is to be dropped (the
  // receive failed while it was read).
  struct placed {
    std::optional<receive> r;
    std::shared_ptr<receive_guard> guard;
    bool drop = false;
  };
  std::vector<std::unique_ptr<placed>> placed_;  // null for ranks of this process
  /// Takes back a placed receive (under mtx_): nothing more is written into its buffer.
  std::optional<receive> revoke(placed& p);
  gone_peers gone_;  // members that left, and how; left_text() names them
  /// "rank 3 (...) left group 'g' (why)".
  std::string left_text(int peer, const std::string& why) const;
  std::optional<std::pair<errc, std::string>> stopped_;
  clock::time_point armed_ = clock::time_point::max();
  bool attached_ = false;
  std::vector<std::shared_ptr<const pumping_plan>> plans_;  // per peer, then any source
  std::vector<lent_send> lent_;                             // this rank's loans not yet returned
  std::vector<split> splits_;  // lent messages this rank copies with their lender
  bool may_split_ = false;     // the job's ranks on this host have a CPU each (split_bytes)
  std::uint64_t loans_ = 0;    // loans made (their numbers)
};

}  // namespace troupe::detail
