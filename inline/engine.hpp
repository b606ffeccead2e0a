#pragma once
// inline engine — collectives run by the threads that wait for them, without actor
// hops: through the group's shared segment when all ranks share the host
// (shm_medium), or as messages (message_medium: handed to ranks of this process,
// frames to others, read by the waiting thread itself). Crossing a thread
// costs 10–20 µs when it wakes an idle core; a flag in shared memory costs
// 0.05–0.25 µs and a socket read by the waiting thread 3 µs, so small
// collectives must not cross threads.
//
// Execution: an operation is queued at issue, in issue order, and advanced
// by non-blocking steps (inline_op::step) by whoever drives the inline engine:
//  - the issuing thread makes one pass (it posts this rank's data at once);
//    a small call on the shared segment's tiny lane is made on the caller's
//    stack and borrows its tensors (submit_borrowed): when the queue is
//    empty it is stepped there, watched for up to the spinning window (at
//    most max_issue_spin) while its peers have not posted, and queued as a
//    copy of its own only if they still have not;
//  - a thread in work.wait() drives until its work is done: it spins, polls
//    while yielding, then sleeps in the medium (a futex; base/wait_policy.hpp).
//    Spinning alone collapses when ranks outnumber cores; sleeping alone pays
//    a wake-up per step;
//  - when operations with continuations are pending and no thread waits
//    for them (the caller chains on_complete or then, awaits from an actor,
//    or a future of another library waits), a driver of the process's
//    progress service (inline/progress.hpp) drives them as a waiting thread
//    would (spin, poll, then sleep in the medium until data arrives), so
//    continuations run as soon as a blocking wait would have returned.
//    Otherwise the service's ticker pokes the engine every millisecond (a
//    thread in wait() drives, or one will: works still complete and
//    deadlines pass); an engine with nothing pending costs nothing.
//    Registering a continuation wakes the ticker. Driving beside a waiting
//    thread would take the CPU from it (ranks bound to one CPU each). The
//    ticker is a plain thread, not an actor: it sleeps on a futex (a CAF
//    timer would wake two threads per tick, which on 2 cores steals time
//    from polling ranks).
// Failures: every operation has a deadline; the medium tells when a rank that
// has not finished the operation is lost (it destroyed the group, or its
// process died), so a rank that finished and left does not fail the slower
// ones: what a lost rank sent before it left still counts (the operation
// tries again, and again while each try moves on to another lost rank), and
// a death is named once crash_grace passed (with the members that died with
// it). After a timeout, a lost peer or ranks calling different collectives,
// the protocol state is unknown, so the inline engine stops: later operations fail
// at once, naming the first failure.

#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/futex_lock.hpp"
#include "base/one_or_more.hpp"
#include "base/rank_names.hpp"
#include "base/wait_chain.hpp"
#include "base/wait_policy.hpp"
#include "base/work_driver.hpp"
#include "inline/medium.hpp"
#include "memory/recycled.hpp"
#include "troupe/error.hpp"
#include "troupe/work.hpp"

namespace troupe {
class store;
}

namespace troupe::detail {

using troupe::store;
class segment;
class peer_memory;
struct work_state;

using inline_clock = std::chrono::steady_clock;

/// The longest an issuing thread spins for the peers of a small call it
/// posted (inline_engine::submit_borrowed): a loop of small calls among
/// ranks of one host comes round in well under it.
inline constexpr std::chrono::nanoseconds max_issue_spin{2'000};

class inline_engine;

/// Which engine runs a call: announced with its collective (inline_engine::announce)
/// so that a rank blocked on one engine can tell that a peer issued the same
/// sequence number on another (its call differs in what picks the engine:
/// PREMUL_SUM, tensors per rank, the device).
enum class route : std::uint8_t { shm = 0, messages = 1, actors = 2, device = 3 };
/// The announced value of collective `code` (an op_code) run by `r`.
inline int announcement(std::uint8_t code, route r) {
  return code | static_cast<int>(r) << 4;
}
/// "rank 1 called allreduce on another engine ...": why announcement `theirs`
/// of group rank `peer` is not this rank's `mine` (both announced values).
std::string announced_mismatch(int peer, int theirs, int mine, const std::string& name);

/// What one step of an operation sees.
struct inline_context {
  inline_engine& engine;
  medium& med;
  segment* seg;  ///< the shared segment (shm_medium), else null
  int rank;
  int size;
  const rank_names& names;  ///< describe(group rank)
  /// Chunks staged by finished operations (chunk numbers are never reused;
  /// an operation takes its numbers once every rank agreed on its size).
  std::uint64_t& chunks;
  /// Every rank lives in this process: buffers can be read and written directly.
  bool one_process;
  /// Between processes of one host: the peers' shared buffers (else null).
  peer_memory* peers;
  /// Where the ranks announce what they issued (this inline engine's medium, or
  /// beside a shared-memory engine that one's).
  medium& announcer;
  /// The last operation for which this rank saw every rank post on the
  /// segment's tiny lanes: each of them had finished the one before.
  std::uint64_t& tiny_seen;
};

/// One collective on the inline engine: a resumable state machine.
/// Lives on the thread's recycled shelves (one per call: base/recycled.hpp).
class inline_op : public recycled {
 public:
  inline_op() = default;
  virtual ~inline_op() = default;
  /// An operation made on the caller's stack, that borrows the caller's
  /// tensors (inline_engine::submit_borrowed), as one of its own on the
  /// heap that holds them: for the queue, when it waits for its peers.
  /// Only operations that can be borrowed have it.
  virtual std::unique_ptr<inline_op> keep();
  /// Advances as far as the peers allow without blocking; true when finished.
  /// Sets `moved` when it published or consumed anything. Throws troupe::error.
  virtual bool step(inline_context& ctx, bool& moved) = 0;
  /// The group rank the last blocked step waits for, and for what (the text
  /// is built when asked: for errors).
  virtual std::pair<int, std::string> blocker() const = 0;
  /// blocker()'s rank alone (asked on every turn of a wait: builds no text).
  virtual int blocked_rank() const { return blocker().first; }
  /// Why the ranks' calls are known to differ while the operation still
  /// waits for some of them ("" when not known): the error at its deadline.
  virtual std::string disagreement() const { return {}; }

  const char* name = "";  ///< "allreduce" (a literal: no copy per call)
  /// What the thread that drives it reads itself (inline/medium.hpp):
  /// everything (small operations: latency), or its host peers' rings
  /// while the data plane's reader threads receive from sockets as it sends
  /// (large ones: bandwidth). Only a local choice.
  reading reads = reading::all;
  std::uint64_t seq = 0;  ///< the group's sequence number
  std::uint64_t op = 0;   ///< the inline engine's operation number (1, 2, ...)
  std::chrono::milliseconds timeout{};
  /// The epoch until set: at submit, or when the operation first blocks as
  /// the queue's head (steps_with_deadline false).
  inline_clock::time_point deadline;
  /// Whether step() reads `deadline` from its first step on (the message
  /// engine's operations send with it); the shared segment's do not.
  bool steps_with_deadline = true;
  /// When a step of it last published or consumed anything (the epoch: not
  /// since it was issued), and whether it told its wait once it had moved
  /// nothing for half its timeout (inline_engine::tell_wait_early).
  inline_clock::time_point progressed;
  bool told_early = false;
  tensor_list outputs;
  /// The sole output instead of `outputs` (no vector per call with one output).
  tensor sole_output;
  work handle;

 protected:
  inline_op(inline_op&&) = default;  ///< keep()
};

/// Bytes this process's inline engines copied and reduced (for the copy-count test).
struct inline_counters {
  std::atomic<std::uint64_t> copied{0};   ///< memcpy into or out of the segment
  std::atomic<std::uint64_t> reduced{0};  ///< bytes of allreduce input
  /// Point-to-point messages this process took from a lender in another
  /// process (inline/mailbox.hpp: copied once, from the sender's buffer).
  std::atomic<std::uint64_t> loans_taken{0};
  /// Of those, the ones copied together with their lender (mailbox::split_bytes).
  std::atomic<std::uint64_t> loans_split{0};
  /// Messages of the message engine that only carry the agreement (its
  /// describe, alarm and dissemination messages, base/agreement.hpp).
  std::atomic<std::uint64_t> described{0};
  /// Algorithms told to pace their transfers to a peer (op_context::paced).
  std::atomic<std::uint64_t> paced{0};
  /// Messages of the message engine consumed by the thread that read them
  /// as they arrived (op_context::consume_on_arrival: a reader thread, for
  /// large operations from peers whose sockets the waiting thread leaves).
  std::atomic<std::uint64_t> consumed{0};
};
/// The process's counters. They count from the first call on (tests ask
/// before what they measure); until then the engines skip them, as an
/// atomic add per small collective costs each call a locked instruction.
inline_counters& inline_stats() noexcept;
/// inline_stats() once something asked for it, else null (the engines' side).
inline_counters* inline_counting() noexcept;

class inline_engine : public std::enable_shared_from_this<inline_engine> {
 public:
  /// `names[r]` describes group rank r in messages.
  inline_engine(std::shared_ptr<medium> med, int rank, std::string group, rank_names names);
  ~inline_engine();

  medium& med() noexcept { return *med_; }
  const std::shared_ptr<medium>& medium_ptr() const noexcept { return med_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept;

  /// Records that this rank issued collective `code` as sequence number `seq`
  /// on engine `r`, so that a peer blocked in an inline operation of another
  /// kind, or on another engine, can tell.
  void announce(std::uint64_t seq, std::uint8_t code, route r);
  /// Operations read the peers' announcements from `m` (the shared-memory
  /// inline engine's medium beside this one) instead of this inline engine's medium.
  void read_announcements_from(std::shared_ptr<medium> m);
  /// The next operation number (the caller serializes issue).
  std::uint64_t next_op() noexcept { return ++issued_; }
  /// Queues `op`, makes one pass and returns its work (op->handle, made
  /// after that pass when unset: op->seq is then the group's sequence number).
  work submit(std::unique_ptr<inline_op> op);
  /// submit() for an operation on the caller's stack that borrows its
  /// tensors: stepped at once when nothing else is queued (a call whose
  /// peers were there first ends here, without an operation on the heap);
  /// queued as op.keep() when it has to wait. `op` is left behind.
  work submit_borrowed(inline_op& op);
  /// Drives until `s` finished or `until` passed.
  void drive(work_state& s, inline_clock::time_point until);
  /// One pass without blocking (skipped while another thread drives).
  bool poke();
  /// A continuation was registered on one of its pending works: the
  /// progress service drives it if no thread waits.
  void continued();
  /// Fails what is queued and everything later with `reason`.
  void abort(const std::string& reason);
  /// Where the ranks tell each other whom they waited for when a call of
  /// theirs timed out (the group's store): a timeout then names the rank
  /// the wait starts at, not only a neighbour that waited as this one did.
  void tell_waits_through(std::shared_ptr<store> s) { waits_ = std::move(s); }
  /// Tells, before its timeout (base/wait_chain.hpp), that call `seq` of
  /// this rank has waited half its `timeout` for group rank `peer` to
  /// `what`: once per call, from the thread that runs it.
  void tell_wait_early(std::uint64_t seq, std::chrono::milliseconds timeout, int peer,
                       const std::string& what);

  // What the progress service (inline/progress.cpp) reads and marks.
  std::atomic<bool>& progress_watched() noexcept { return watched_; }
  std::atomic<bool>& progress_driven() noexcept { return driven_; }
  bool idle() { return queue_empty(); }
  /// Continuations wait and no thread drives.
  bool needs_driver() { return waiters_.load() == 0 && continued_pending(); }
  /// Drives the head operations while continuations wait and no thread does.
  void drive_continued();

 private:
  struct finished {
    std::unique_ptr<inline_op> op;
    std::exception_ptr error;
  };
  /// What one pass finished: mostly one operation.
  using finished_list = one_or_more<finished>;
  /// One pass over the head operations; `now`: the caller's clock reading
  /// (deadlines and lost peers are checked against it: one reading per turn
  /// of a waiting thread).
  bool pass(bool block_on_lock, inline_clock::time_point now);
  /// `now` the epoch: not read yet (submit); read here once the head blocks.
  bool step_head(finished_list& out, inline_clock::time_point& now);
  /// One step of `op`: sets `finished`, or returns why it failed (the
  /// engine then stops, unless every rank fails alike: a disagreement).
  std::exception_ptr try_step(inline_op& op, inline_context& ctx, bool& moved, bool& finished);
  /// The error of `op` failing for `cause`; `stops`: the engine stops with it.
  std::exception_ptr failed(const inline_op& op, errc code, const std::string& cause, bool stops);
  /// The work of `o`, which has just been queued or ended (under the lock):
  /// made here if unset (`unseen` then points at `o`: nobody else has it yet).
  work work_of(inline_op& o, inline_clock::time_point now, const inline_op*& unseen);
  /// Completes or fails what left the queue (outside the lock); `now`: the
  /// pass's clock reading, their end in the flight record. `unseen`: an
  /// operation whose work no other thread has seen yet (submit made it and
  /// has not returned it): completed without its lock.
  static void hand_over(finished_list& out, inline_clock::time_point now,
                        const inline_op* unseen = nullptr);
  /// Ends `w`, the work of `op`, with `failure` or with op's outputs
  /// (`unseen`: no other thread has the work: completed without its lock).
  static void end_work(const work& w, inline_op& op, const std::exception_ptr& failure,
                       bool unseen);
  int blocker();
  /// After `op` timed out waiting for group rank `peer` to `what`: tells
  /// the others so, and follows whom `peer` (and whom that one) waited for,
  /// as they tell it, until a rank that waits for nobody on this call: "; X
  /// was itself waiting for Y to ...; ... the wait starts there" and that
  /// rank (base/wait_chain.hpp; empty when `peer` waited for nobody: the
  /// message names it already).
  told_waits wait_chain(const inline_op& op, int peer, const std::string& what);
  /// Fails `op` at its timeout waiting for group rank `peer` (-1: the peers)
  /// to `what`, following the chain of waits from it (wait_chain).
  std::exception_ptr timed_out(const inline_op& op, int peer, const std::string& what);
  reading head_reads();
  void stop(const std::string& reason);

  /// What every step sees, made at the first step (guarded by engine_): its
  /// medium's answers do not change, and asking them (virtual calls) at each
  /// pass would cost a small collective some tens of instructions, and a waiting
  /// thread as many at each turn.
  inline_context& context();

  std::shared_ptr<medium> med_;
  std::shared_ptr<store> waits_;           // tell_waits_through (null: no chain)
  std::shared_ptr<medium> announcer_;      // null: med_
  std::optional<inline_context> context_;  // guarded by engine_
  int rank_;
  std::string group_;
  rank_names names_;
  wait_policy policy_;  ///< how drive() waits (no pure spin when ranks outnumber CPUs)
  /// How long submit_borrowed watches for the peers of a call it posted
  /// before it queues it: the policy's spinning (none when ranks outnumber
  /// CPUs), at most max_issue_spin.
  inline_clock::duration issue_spin_;
  std::uint64_t issued_ = 0;
  std::uint64_t chunks_ = 0;     // guarded by engine_
  std::uint64_t tiny_seen_ = 0;  // guarded by engine_
  futex_lock engine_;            // held while stepping (guards queue_, stopped_, chunks_)
  std::deque<std::unique_ptr<inline_op>> queue_;
  std::string stopped_;  // non-empty once the inline engine stopped
  std::atomic<int> waiters_{0};
  /// Drives while go_on() (checked between steps and in sleeps) and before `until`.
  void run(const std::function<bool()>& go_on, inline_clock::time_point until);
  bool queue_empty();
  /// Whether a queued operation's work has a continuation (on_complete, then).
  bool continued_pending();
  /// Set when a continuation was first registered on one of this engine's
  /// pending works: until then continued_pending() is false without a look
  /// (a program that only waits never pays for its locks).
  std::atomic<bool> ever_continued_{false};
  /// Whether the queue's head reads incoming data itself (true when empty),
  /// kept by step_head, which every change of the head passes through, so
  /// that a waiting thread asks it without the engine's lock.
  std::atomic<reading> head_reads_{reading::all};
  std::uint64_t head_op();            ///< the operation number of the queue's head (0: empty)
  std::atomic<bool> watched_{false};  ///< on the progress ticker's list
  std::atomic<bool> driven_{false};   ///< a progress driver runs drive_continued()
  /// Its works' driver (drive, poke and continued reach this engine while
  /// it lives), made at the first submit; guarded by engine_.
  std::shared_ptr<const work_driver> driver_;
};

}  // namespace troupe::detail
