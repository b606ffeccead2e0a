#pragma once
// The shared state behind troupe::work.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/one_or_more.hpp"
#include "base/work_driver.hpp"
#include "troupe/work.hpp"

namespace troupe::detail {

class flight_ring;
class shared_task;

/// A relay: troupe's own callback that only completes other works (when_all's
/// count). A plain function and its argument, so that registering one
/// allocates nothing (a work mostly has none or one).
struct relay {
  void (*fn)(void* arg, const work& done);
  void* arg;
};

struct work_state {
  std::mutex mtx;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  tensor_list outputs;
  /// The output of a call that has one (allreduce, broadcast, send, recv,
  /// ...), kept without a vector; `outputs` is then empty. Read through outputs_of.
  tensor sole_output;
  int source_rank = -1;
  std::atomic<std::uint64_t> seq{0};
  /// The call's name: one of troupe's literals (no copy per call), or
  /// `op_text` where the name is made at run time ("allreduce.then").
  const char* op = "";
  std::string op_text;
  std::string group;
  std::vector<std::function<void(const work&)>> callbacks;
  /// Run on the completing thread even when `callbacks` are handed
  /// elsewhere; what they complete hands its callbacks on likewise.
  one_or_more<relay> relays;
  /// Set together with done; polled by threads that drive the operation.
  std::atomic<bool> finished{false};
  /// For operations that progress in the waiting thread (inline/engine.hpp):
  /// what drives them (null: the operation moves elsewhere, a waiter
  /// sleeps). Set before the work is handed out; continued() is called
  /// outside mtx.
  std::shared_ptr<const work_driver> driver;
  /// The flight record the call is in (null: not recorded) and its id
  /// there; the end is written into it before waiters return.
  std::shared_ptr<flight_ring> ring;
  std::uint64_t ring_id = 0;
  /// When an inline engine took the call (its clock reading, reused by the
  /// flight record; the epoch: not known).
  std::chrono::steady_clock::time_point issued{};
  /// When an inline engine saw the call end (the clock reading of the pass
  /// that finished it, at most a turn of a waiting thread old), set before it
  /// completes the work; the flight record's end, without a clock read on
  /// the path to the waiter (the epoch: finish() reads the clock).
  std::chrono::steady_clock::time_point ended{};
  /// A copy the threads waiting for this work may take part in (a large
  /// message between ranks of one process: base/shared_task.hpp), under
  /// mtx; `helpable` says there is one, for threads that poll.
  std::shared_ptr<shared_task> help;
  std::atomic<bool> helpable{false};
  /// The work this one is a part of (work::when_all, which keeps it alive
  /// until this work completes): its waiters are offered this work's
  /// copies too, while this work is pending.
  std::atomic<work_state*> whole{nullptr};
};

/// A new work named by `literal` (a string literal: it is kept, not copied).
work make_work(const char* literal, std::string group, std::uint64_t seq = 0);
/// `all` completed once every part did (with their outputs, in order) or
/// failed with the first part's failure: work::when_all for a work made
/// already (make_work's literal name, no string of its own).
work join(work all, std::vector<work> parts);
/// join, but `all` completes with `outputs` (its parts' outputs are known
/// already, or some parts were done without a work of their own).
work join(work all, std::vector<work> parts, tensor_list outputs);

/// Runs a function on another thread (completions' callbacks).
using callback_runner = std::function<void(std::function<void()>)>;

/// Completes (fails) `w` like work::complete (work::fail) — the result and
/// the finished flag at once, so waiters return — but hands its callbacks,
/// if any, to `run` instead of running them on this thread: the thread may
/// be another rank's, or the one that reads a peer's frames, and a callback
/// that waits for that rank or that peer would wait for itself.
void complete_elsewhere(const work& w, tensor_list outputs, int source_rank,
                        const callback_runner& run);
void fail_elsewhere(const work& w, std::exception_ptr error, const callback_runner& run);
/// work::complete({output}, source_rank) and complete_elsewhere without
/// building the list (work_state::sole_output).
void complete_with_one(const work& w, tensor output, int source_rank = -1);
void complete_one_elsewhere(const work& w, tensor output, int source_rank,
                            const callback_runner& run);
/// Completes a work no other thread has seen yet (its maker has not handed
/// it out: no waiter, callback, relay or flight record can be there) with
/// `outputs` or `sole`, without its lock; where one is there after all, as
/// work::complete.
void complete_unseen(const work& w, tensor_list outputs, tensor sole);
/// A finished state's outputs (sole_output or the list; under its mutex, or
/// once nothing changes them): how many, appended to `out`, and as
/// work::result() returns them.
std::size_t output_count(const work_state& s);
void append_outputs(const work_state& s, tensor_list& out);
tensor_list outputs_of(const work_state& s);
/// Offers copy `c` to the threads waiting for `w` (work_state::help) and for
/// what it is a part of, waking the sleeping ones, until withdraw_help(w, c).
/// A later offer replaces an earlier one still there.
void offer_help(const work& w, const std::shared_ptr<shared_task>& c);
void withdraw_help(const work& w, const shared_task* c);
/// Takes part in the copy offered to the waiters of `s`, if any and not
/// `helped` already (the last one this thread took part in: updated); true
/// when there was one.
bool lend_a_hand(work_state& s, const shared_task*& helped);
/// Registers a relay of `w` (work_state::relays); runs it now if `w` is done.
void on_complete_relay(const work& w, relay r);

}  // namespace troupe::detail
