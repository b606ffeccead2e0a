#include "inline/engine.hpp"
#include "base/texts.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <tuple>

#include "base/agreement.hpp"
#include "base/call.hpp"
#include "base/futex.hpp"
#include "base/sim_conductor.hpp"
#include "base/wait_chain.hpp"
#include "base/wait_policy.hpp"
#include "base/work_state.hpp"
#include "inline/medium.hpp"
#include "inline/progress.hpp"
#include "troupe/error.hpp"
#include "troupe/store.hpp"

namespace troupe::detail {

namespace {

using namespace std::chrono_literals;

/// The longest single sleep: peers' liveness and deadlines are re-checked this often.
constexpr auto max_sleep = 2ms;

/// What a work of an engine's reaches it through (while the engine lives).
struct engine_driver final : work_driver {
  explicit engine_driver(std::weak_ptr<inline_engine> e) : engine(std::move(e)) {}
  void drive(work_state& s, inline_clock::time_point until) const override {
    if (auto e = engine.lock()) e->drive(s, until);
  }
  bool poke() const override {
    auto e = engine.lock();
    return e && e->poke();
  }
  void continued() const override {
    if (auto e = engine.lock()) e->continued();
  }
  std::weak_ptr<inline_engine> engine;
};

}  // namespace

namespace {

inline_counters& counters() noexcept {
  static inline_counters c;
  return c;
}

std::atomic<bool> counting{false};

}  // namespace

inline_counters& inline_stats() noexcept {
  counting.store(true, std::memory_order_relaxed);
  return counters();
}

inline_counters* inline_counting() noexcept {
  return counting.load(std::memory_order_relaxed) ? &counters() : nullptr;
}

inline_engine::inline_engine(std::shared_ptr<medium> med, int rank, std::string group,
                             rank_names names)
    : med_(std::move(med)),
      rank_(rank),
      group_(std::move(group)),
      names_(std::move(names)),
      policy_(wait_policy::get().for_ranks(med_->ranks_on_host())),
      issue_spin_(std::min<inline_clock::duration>(policy_.spin, max_issue_spin)) {}

inline_engine::~inline_engine() {
  abort("the group was destroyed");
  med_->leave();
}

int inline_engine::size() const noexcept {
  return med_->size();
}

void inline_engine::announce(std::uint64_t seq, std::uint8_t code, route r) {
  med_->announce(seq, static_cast<std::uint8_t>(announcement(code, r)));
}

std::string announced_mismatch(int peer, int theirs, int mine, const std::string& name) {
  const auto code = [](int a) { return std::string(to_string(static_cast<op_code>(a & 15))); };
  if ((theirs & 15) != (mine & 15))
    return mismatch_text("rank " + std::to_string(peer) + " called " + code(theirs) +
                         " at the same sequence number, this rank called " + name);
  return mismatch_text(
      "rank " + std::to_string(peer) + " called " + code(theirs) +
      " too, but one that runs on another engine (it differs in the reduce op, the tensors " +
      "per rank or the device)");
}

std::unique_ptr<inline_op> inline_op::keep() {
  throw std::logic_error(std::string("troupe: operation '") + name +
                         "' cannot be moved from its caller");
}

work inline_engine::submit(std::unique_ptr<inline_op> op) {
  // Alive while the lock below is held: queued, or in `out` once finished.
  inline_op& o = *op;
  // Queued and stepped in one critical section (a tiny call whose peers
  // were there first ends here).
  finished_list out;
  // The clock is read at once for an operation that waits behind others or
  // whose first step sends with its deadline; else once it blocks (step_head),
  // so that a call whose peers were there first posts without a clock
  // reading before it (24 ns, a tenth of a small call between processes).
  inline_clock::time_point now{};
  work w;
  const inline_op* unseen = nullptr;  // its work made here: nobody else has it yet
  {
    std::lock_guard<futex_lock> g{engine_};
    if (!queue_.empty() || o.steps_with_deadline) {
      now = inline_clock::now();
      o.deadline = now + o.timeout;
    }
    queue_.push_back(std::move(op));
    step_head(out, now);
    w = work_of(o, now, unseen);
  }
  hand_over(out, now, unseen);
  // Watched already (mostly): no owner count up and down to ask again.
  if (!w.state()->finished.load() && !watched_.load(std::memory_order_acquire))
    progress_watch(shared_from_this());
  return w;
}

work inline_engine::work_of(inline_op& o, inline_clock::time_point now, const inline_op*& unseen) {
  // The work, once this rank posted (what comes before the post delays
  // the peers): no step reads it, and no other thread steps the
  // operation or completes it before the lock is released.
  if (!o.handle.valid()) {
    o.handle = make_work(o.name, group_, o.seq);
    unseen = &o;
  }
  if (!driver_) driver_ = std::make_shared<engine_driver>(weak_from_this());
  auto& s = *o.handle.state();
  s.driver = driver_;
  // The epoch when no step read the clock: the flight record reads it.
  s.issued = now;
  return o.handle;
}

work inline_engine::submit_borrowed(inline_op& o) {
  {
    std::unique_lock<futex_lock> g{engine_};
    if (queue_.empty() && stopped_.empty() && !o.steps_with_deadline) {
      bool moved = false, done = false;
      auto& ctx = context();
      auto failure = try_step(o, ctx, moved, done);
      if (!failure && !done && issue_spin_ > inline_clock::duration{} && !in_simulation()) {
        // Posted, and the peers have not yet: in a loop of small calls they
        // are about to (finishing the call before), so watch for them a
        // moment rather than queue the operation and hand it to a waiting
        // thread.
        const auto until = inline_clock::now() + issue_spin_;
        do {
          cpu_relax();
          failure = try_step(o, ctx, moved, done);
        } while (!failure && !done && inline_clock::now() < until);
      }
      if (failure || done) {
        // Ended in its first step or while watched: its work is made now
        // and given the result (or the error) at once; no other thread can
        // have it, and the caller waits for nothing (it needs no driver).
        med_->end_op(o.op);
        g.unlock();
        const bool seen = o.handle.valid();
        work w = seen ? std::move(o.handle) : make_work(o.name, group_, o.seq);
        end_work(w, o, failure, !seen);
        return w;
      }
      // Waits for its peers: queued, with its deadline from now (as the
      // head's first blocked step sets it); the next pass checks them.
      auto kept = o.keep();
      auto& k = *kept;
      const auto now = inline_clock::now();
      k.deadline = now + k.timeout;
      queue_.push_back(std::move(kept));
      head_reads_.store(k.reads, std::memory_order_release);
      const inline_op* unseen = nullptr;
      auto w = work_of(k, now, unseen);
      g.unlock();
      if (!watched_.load(std::memory_order_acquire)) progress_watch(shared_from_this());
      return w;
    }
  }
  return submit(o.keep());
}

void inline_engine::continued() {
  ever_continued_.store(true);
  progress_wake(shared_from_this());
}

void inline_engine::drive(work_state& s, inline_clock::time_point until) {
  run([&] { return !s.finished.load(std::memory_order_acquire); }, until);
  // Operations left pending with continuations: a progress driver takes
  // them over, now that no thread waits.
  if (waiters_.load() == 0 && continued_pending()) progress_wake(shared_from_this());
}

bool inline_engine::continued_pending() {
  if (!ever_continued_.load()) return false;
  std::lock_guard<futex_lock> g{engine_};
  for (auto& op : queue_) {
    auto& st = *op->handle.state();
    std::lock_guard<std::mutex> l{st.mtx};
    if (!st.callbacks.empty()) return true;
  }
  return false;
}

void inline_engine::run(const std::function<bool()>& go_on, inline_clock::time_point until) {
  waiters_.fetch_add(1);
  // What this thread reads itself (pump), and from when (`began`):
  // from the first turn, or once the wait lasted read_after() (the shared
  // segment reads the point-to-point rings only so that a long wait wakes
  // no reader thread; a short one need not pay for it) or its spinning
  // window (none with more ranks than CPUs).
  const reading reads = med_->reads_while_waiting(head_reads());
  const auto read_after = reads != reading::none
                              ? std::min<inline_clock::duration>(med_->read_after(), policy_.spin)
                              : inline_clock::duration{};
  bool began = false;
  // One clock reading per turn, for the pass (deadlines, lost peers) and
  // for the wait alike; polling counts from the first turn that leaves the
  // operation pending.
  inline_clock::time_point first{}, polling_since{};
  while (go_on()) {
    const auto now = inline_clock::now();
    if (first == inline_clock::time_point{}) first = now;
    if (reads != reading::none && !began && now - first >= read_after) {
      med_->begin_wait(reads);
      began = true;
    }
    const bool moved = (began && med_->pump(reads)) | pass(true, now);
    if (!go_on()) break;
    if (now >= until) break;
    if (moved || polling_since == inline_clock::time_point{}) {
      polling_since = now;
      if (moved) continue;
    }
    if (policy_.poll_step(now - polling_since)) continue;
    const auto nap = std::min<inline_clock::duration>(until - now, max_sleep);
    med_->sleep(
        blocker(), nap,
        [&] { return (began && med_->pump(reads)) | pass(true, inline_clock::now()) || !go_on(); },
        began ? reads : reading::none);
    polling_since = inline_clock::now();
  }
  if (began) med_->end_wait(reads);
  waiters_.fetch_sub(1);
}

bool inline_engine::queue_empty() {
  std::lock_guard<futex_lock> g{engine_};
  return queue_.empty();
}

std::uint64_t inline_engine::head_op() {
  std::lock_guard<futex_lock> g{engine_};
  return queue_.empty() ? 0 : queue_.front()->op;
}

bool inline_engine::poke() {
  if (waiters_.load() != 0) return false;
  med_->pump(reading::all);
  return pass(false, inline_clock::now());
}

void inline_engine::drive_continued() {
  // One run per head operation: each chooses whether its driver reads.
  while (needs_driver()) {
    const auto head = head_op();
    if (head == 0) break;
    run([this, head] { return waiters_.load() == 1 && head_op() == head; },
        inline_clock::time_point::max());
  }
}

reading inline_engine::head_reads() {
  return head_reads_.load(std::memory_order_acquire);
}

int inline_engine::blocker() {
  std::lock_guard<futex_lock> g{engine_};
  const int r = queue_.empty() ? -1 : queue_.front()->blocked_rank();
  return r < 0 ? rank_ : r;
}

void inline_engine::abort(const std::string& reason) {
  finished_list out;
  {
    std::lock_guard<futex_lock> g{engine_};
    stop(reason);
    auto now = inline_clock::now();
    step_head(out, now);
  }
  out.for_each([](finished& f) { f.op->handle.fail(f.error); });
  med_->wake_all();  // threads of this rank sleeping in the medium
}

void inline_engine::stop(const std::string& reason) {
  if (stopped_.empty()) stopped_ = reason;
}

bool inline_engine::pass(bool block_on_lock, inline_clock::time_point now) {
  finished_list out;
  bool moved = false;
  {
    std::unique_lock<futex_lock> g{engine_, std::defer_lock};
    if (block_on_lock)
      g.lock();
    else if (!g.try_lock())
      return false;
    moved = step_head(out, now);
  }
  hand_over(out, now);
  return moved || !out.empty();
}

void inline_engine::hand_over(finished_list& out, inline_clock::time_point now,
                              const inline_op* unseen) {
  // Outside the lock: a callback may issue the next collective.
  out.for_each([now, unseen](finished& f) {
    f.op->handle.state()->ended = now;
    end_work(f.op->handle, *f.op, f.error, f.op.get() == unseen);
  });
}

void inline_engine::end_work(const work& w, inline_op& op, const std::exception_ptr& failure,
                             bool unseen) {
  if (failure)
    w.fail(failure);
  else if (unseen)
    complete_unseen(w, std::move(op.outputs), std::move(op.sole_output));
  else if (op.sole_output.defined())
    complete_with_one(w, std::move(op.sole_output));
  else
    w.complete(std::move(op.outputs));
}

void inline_engine::read_announcements_from(std::shared_ptr<medium> m) {
  std::lock_guard<futex_lock> g{engine_};
  announcer_ = std::move(m);
  context_.reset();
}

inline_context& inline_engine::context() {
  if (!context_)
    context_.emplace(inline_context{*this, *med_, med_->shared_segment(), rank_, size(), names_,
                                    chunks_, med_->one_process(), med_->peers(),
                                    announcer_ ? *announcer_ : *med_, tiny_seen_});
  return *context_;
}

std::exception_ptr inline_engine::failed(const inline_op& op, errc code, const std::string& cause,
                                         bool stops) {
  auto msg = call_location(op.name, group_, rank_, op.seq) + " failed: " + cause;
  if (stops) stop(msg);
  return std::make_exception_ptr(error(code, msg));
}

std::exception_ptr inline_engine::try_step(inline_op& op, inline_context& ctx, bool& moved,
                                           bool& finished) {
  try {
    bool m = false;
    finished = op.step(ctx, m);
    moved |= m;
    return nullptr;
  } catch (const disagreement_error& e) {
    // Every rank sees the same disagreement and steps past the operation.
    moved = true;
    return failed(op, e.code(), e.what(), false);
  } catch (const peer_given_up& e) {
    // Its deadline came with data a peer did not take: a timeout waiting
    // for that peer.
    moved = true;
    return timed_out(op, e.peer(), e.what_waited());
  } catch (const error& e) {
    // Anything else leaves the protocol state unknown.
    moved = true;
    return failed(op, e.code(), e.what(), true);
  } catch (const std::exception& e) {
    moved = true;
    return failed(op, errc::internal, std::string("internal error: ") + e.what(), true);
  } catch (...) {
    moved = true;
    return failed(op, errc::internal, "internal error: an unknown exception", true);
  }
}

bool inline_engine::step_head(finished_list& out, inline_clock::time_point& now) {
  auto& ctx = context();
  bool moved = false;
  // The head leaves the queue, finished (no error) or failed; end_op runs
  // before its caller hears, so nothing writes its buffers afterwards.
  auto leave = [&](std::exception_ptr failure) {
    auto op = std::move(queue_.front());
    queue_.pop_front();
    med_->end_op(op->op);
    out.push_back({std::move(op), std::move(failure)});
  };
  while (!queue_.empty()) {
    auto& op = *queue_.front();
    if (!stopped_.empty()) {
      leave(failed(op, errc::aborted,
                   "the group's engine stopped after an earlier failure: " + stopped_, false));
      continue;
    }
    bool finished_now = false;
    bool op_moved = false;
    auto f = try_step(op, ctx, op_moved, finished_now);
    moved |= op_moved;
    if (f) {
      leave(std::move(f));
      continue;
    }
    if (finished_now) {
      leave(nullptr);
      continue;
    }
    int peer = op.blocked_rank();
    // Blocked: the clock now, and the deadline counts from here if submit
    // left it unset.
    if (now == inline_clock::time_point{}) now = inline_clock::now();
    if (op.deadline == inline_clock::time_point{}) op.deadline = now + op.timeout;
    if (op_moved) op.progressed = now;
    // In a simulation the conductor alone, in virtual time, fails a wait
    // that a killed or frozen rank blocks: the medium's checks run on wall
    // time (a scan period, a grace for ranks that left), which would make
    // the schedule depend on the machine's speed.
    auto why = in_simulation() ? std::string{} : med_->lost(op.op, peer, now);
    bool ended = false;
    while (!why.empty()) {
      // What the peer published before it left still counts (its goodbye
      // came after it): one more try, seen as lost before it. A try that
      // moves on to wait for another rank that left asks that one's
      // messages once more too: they may have come (and its goodbye) while
      // the try ran, after it looked. Only a try that still waits for the
      // rank found lost before it fails the operation.
      if (auto f = try_step(op, ctx, moved, finished_now)) {
        leave(std::move(f));
        ended = true;
        break;
      }
      if (finished_now) {
        leave(nullptr);
        ended = true;
        break;
      }
      const int before = peer;
      peer = op.blocked_rank();
      if (peer == before) {
        leave(failed(op, errc::peer_failure, why + " before finishing this " + op.name, true));
        ended = true;
        break;
      }
      why = med_->lost(op.op, peer, now);
    }
    if (ended) continue;
    // Nothing moved for half its timeout: the wait is told before it times
    // out, for the ranks whose timeouts come first (base/wait_chain.hpp).
    // One that still moves tells nothing early: whom it waits for at a
    // moment is not what holds it up.
    if (!op.told_early && peer >= 0 && now < op.deadline &&
        now - std::max(op.progressed, op.deadline - op.timeout) >= tell_early_after(op.timeout)) {
      op.told_early = true;
      tell_wait_early(op.seq, op.timeout, peer, op.blocker().second);
    }
    if (now >= op.deadline) {
      if (auto why = op.disagreement(); !why.empty()) {
        leave(failed(op, errc::mismatch, mismatch_text(why), true));
        continue;
      }
      leave(timed_out(op, peer, op.blocker().second));
      continue;
    }
    break;
  }
  head_reads_.store(queue_.empty() ? reading::all : queue_.front()->reads,
                    std::memory_order_release);
  return moved;
}

std::exception_ptr inline_engine::timed_out(const inline_op& op, int peer,
                                            const std::string& what) {
  auto name = [this](int r) { return names_[static_cast<std::size_t>(r)]; };
  return failed(op, errc::timeout,
                timeout_after(op.timeout) + " " +
                    (peer < 0 ? std::string("waiting for the peers")
                              : blame("waiting for " + name(peer) + " to " + what,
                                      wait_chain(op, peer, what), name)),
                true);
}

void inline_engine::tell_wait_early(std::uint64_t seq, std::chrono::milliseconds timeout, int peer,
                                    const std::string& what) {
  if (waits_ && !in_simulation()) detail::tell_wait_early(waits_, seq, rank_, peer, what, timeout);
}

told_waits inline_engine::wait_chain(const inline_op& op, int peer, const std::string& what) {
  if (!waits_ || in_simulation()) return {};
  return detail::wait_chain(
      waits_, op.seq, rank_, size(), peer, what,
      [this](int r) { return names_[static_cast<std::size_t>(r)]; },
      std::chrono::duration_cast<std::chrono::milliseconds>(op.timeout));
}

}  // namespace troupe::detail
