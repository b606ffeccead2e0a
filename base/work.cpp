#include "troupe/work.hpp"
#include "base/texts.hpp"

#include <algorithm>
#include <cstdio>

#include "base/flight_ring.hpp"
#include "base/shared_task.hpp"
#include "base/sim_conductor.hpp"
#include "base/wait_policy.hpp"
#include "base/work_state.hpp"
#include "memory/recycled.hpp"
#include "troupe/error.hpp"

namespace troupe {

using detail::shared_task;
using detail::work_state;

namespace {

const work_state& checked(const std::shared_ptr<work_state>& s) {
  if (!s) throw error(errc::invalid_argument, "work: this work is not attached to any operation");
  return *s;
}

std::string describe(const work_state& s) {
  return detail::call_location(s.op, s.group, -1, s.seq.load());
}

/// Runs a user's callback: what it throws stays with it (reported on stderr),
/// never escaping into whichever call happened to complete the work.
void run_callback(const std::function<void(const work&)>& fn, const work& w,
                  const work_state& s) noexcept {
  try {
    fn(w);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[troupe] an on_complete callback of %s threw: %s\n", describe(s).c_str(),
                 e.what());
  } catch (...) {
    std::fprintf(stderr, "[troupe] an on_complete callback of %s threw an unknown exception\n",
                 describe(s).c_str());
  }
}

}  // namespace

namespace {

/// Before blocking on the condition variable, poll briefly (wait_policy): an
/// operation that ends within microseconds then costs no wake-up.
void poll_for_done(work_state& s, std::chrono::steady_clock::time_point until) {
  const auto& policy = detail::wait_policy::get();
  const shared_task* helped = nullptr;
  auto start = std::chrono::steady_clock::now();
  for (auto now = start; !s.finished.load(std::memory_order_acquire) && now < until;
       now = std::chrono::steady_clock::now()) {
    if (s.helpable.load(std::memory_order_acquire) && detail::lend_a_hand(s, helped)) {
      start = std::chrono::steady_clock::now();  // the operation is moving: poll on
      continue;
    }
    if (!policy.poll_step(now - start)) return;
  }
}

/// Sleeps until `s` is done or `until`, taking part in the copies offered
/// to its waiters meanwhile; false at `until`.
bool sleep_for_done(work_state& s, std::chrono::steady_clock::time_point until) {
  const shared_task* helped = nullptr;
  std::unique_lock<std::mutex> g{s.mtx};
  for (;;) {
    auto ready = [&] { return s.done || (s.help && s.help.get() != helped); };
    if (until == std::chrono::steady_clock::time_point::max())
      s.cv.wait(g, ready);
    else if (!s.cv.wait_until(g, until, ready))
      return false;
    if (s.done) return true;
    g.unlock();
    lend_a_hand(s, helped);
    g.lock();
  }
}

/// What a waiting thread does before it sleeps: drives the operation (when
/// it moves in the waiting thread) or polls briefly. Nothing once it
/// finished (a callback may ask a finished work for its result while its
/// thread holds what driving would take).
void advance(work_state& s, std::chrono::steady_clock::time_point until) {
  if (s.finished.load(std::memory_order_acquire)) return;
  if (auto* sim = detail::sim_here()) {  // a rank of troupe::testing::simulate
    sim->wait(detail::sim_rank_here(), s);
    return;
  }
  if (s.driver)
    s.driver->drive(s, until);
  else
    poll_for_done(s, until);
}

/// A timed simulation's rank waited for `s`: its virtual clock moves on.
void waited_in_simulation(const work_state& s) {
  // One relaxed load while no simulation runs in the process.
  if (detail::timed_here()) detail::sim_here()->clock()->waited(detail::sim_rank_here(), s);
}

}  // namespace

void work::wait() const {
  auto& s = const_cast<work_state&>(checked(state_));
  // Finished already (mostly: a small collective whose peers were there
  // first ends in its issuing call): its error was set before `finished`
  // and never changes after, so neither the lock nor a drive is needed.
  if (s.finished.load(std::memory_order_acquire)) {
    if (s.error) std::rethrow_exception(s.error);
    waited_in_simulation(s);
    return;
  }
  advance(s, std::chrono::steady_clock::time_point::max());
  // Mostly the drive finished it: no lock, as above.
  if (!s.finished.load(std::memory_order_acquire))
    sleep_for_done(s, std::chrono::steady_clock::time_point::max());
  if (s.error) std::rethrow_exception(s.error);
  waited_in_simulation(s);
}

void work::wait(duration timeout) const {
  auto& s = const_cast<work_state&>(checked(state_));
  const auto until = std::chrono::steady_clock::now() + timeout;
  advance(s, until);
  if (!sleep_for_done(s, until))
    throw error(errc::timeout,
                "work.wait: " + detail::timeout_after(timeout) + " waiting for " + describe(s));
  if (s.error) std::rethrow_exception(s.error);
  waited_in_simulation(s);
}

bool work::is_completed() const {
  auto& s = const_cast<work_state&>(checked(state_));
  if (s.driver && !s.finished.load()) s.driver->poke();
  std::lock_guard<std::mutex> g{s.mtx};
  return s.done;
}

bool work::is_success() const {
  auto& s = const_cast<work_state&>(checked(state_));
  std::lock_guard<std::mutex> g{s.mtx};
  return s.done && !s.error;
}

std::exception_ptr work::exception() const {
  auto& s = const_cast<work_state&>(checked(state_));
  std::lock_guard<std::mutex> g{s.mtx};
  return s.error;
}

tensor_list work::result() const {
  wait();
  auto& s = const_cast<work_state&>(checked(state_));
  std::lock_guard<std::mutex> g{s.mtx};
  return detail::outputs_of(s);
}

int work::source_rank() const {
  auto& s = const_cast<work_state&>(checked(state_));
  std::lock_guard<std::mutex> g{s.mtx};
  return s.source_rank;
}

std::uint64_t work::sequence_number() const {
  return checked(state_).seq.load();
}
std::string work::op_name() const {
  return checked(state_).op;
}
std::string work::group_name() const {
  return checked(state_).group;
}

namespace {

/// A continuation's driver: its parent's (while the parent lives).
struct parent_driver final : detail::work_driver {
  explicit parent_driver(std::weak_ptr<work_state> p) : parent(std::move(p)) {}
  void drive(work_state&, std::chrono::steady_clock::time_point until) const override {
    if (auto p = parent.lock(); p && !p->finished.load(std::memory_order_acquire))
      p->driver->drive(*p, until);
  }
  bool poke() const override {
    auto p = parent.lock();
    return p && p->driver->poke();
  }
  std::weak_ptr<work_state> parent;
};

/// Registers `fn` among the callbacks of `w`, or runs it at once when `w` is done.
void add_callback(const work& w, std::function<void(const work&)> fn) {
  auto& s = const_cast<work_state&>(*w.state());
  {
    std::unique_lock<std::mutex> g{s.mtx};
    if (!s.done) {
      s.callbacks.push_back(std::move(fn));
      g.unlock();
      if (s.driver) s.driver->continued();
      return;
    }
  }
  run_callback(fn, w, s);
}

}  // namespace

void work::on_complete(std::function<void(const work&)> fn) const {
  checked(state_);
  add_callback(*this, std::move(fn));
}

work work::then(std::function<tensor_list(const work&)> fn) const {
  auto& s = checked(state_);
  auto next = make(std::string(s.op) + ".then", s.group, s.seq.load());
  // Waiting on the continuation drives the operation it continues (an inline engine
  // operation moves in the thread that waits for it; without this it would
  // move only on the inline engine's watchdog tick).
  if (s.driver) next.state_->driver = std::make_shared<parent_driver>(state_);
  on_complete([next, fn = std::move(fn)](const work& done) {
    try {
      next.complete(fn(done));
    } catch (...) {
      next.fail(std::current_exception());
    }
  });
  return next;
}

namespace detail {

work make_work(const char* literal, std::string group, std::uint64_t seq) {
  auto s = std::allocate_shared<work_state>(recycling_allocator<work_state>{});
  s->op = literal;
  s->group = std::move(group);
  s->seq.store(seq, std::memory_order_relaxed);  // not shared yet (a seq_cst store locks the bus)
  return work::attach(std::move(s));
}

}  // namespace detail

work work::make(std::string op, std::string group, std::uint64_t seq) {
  auto w = detail::make_work("", std::move(group), seq);
  auto& s = *w.state_;
  s.op_text = std::move(op);
  s.op = s.op_text.c_str();  // the state never moves
  return w;
}

work work::completed(std::string op, std::string group, tensor_list outputs) {
  auto w = make(std::move(op), std::move(group));
  w.complete(std::move(outputs));
  return w;
}

work work::failed(std::string op, std::string group, std::exception_ptr error) {
  auto w = make(std::move(op), std::move(group));
  w.fail(std::move(error));
  return w;
}

namespace {

/// Where the callbacks of completions inside relays go: set while the
/// relays of a completion whose callbacks were handed elsewhere run.
thread_local const detail::callback_runner* relay_runner = nullptr;

void finish(const work& w, work_state& s, tensor_list* outputs, tensor* sole, int source,
            std::exception_ptr err, const detail::callback_runner* elsewhere = nullptr) {
  std::vector<std::function<void(const work&)>> callbacks;
  detail::one_or_more<detail::relay> relays;
  {
    std::lock_guard<std::mutex> g{s.mtx};
    if (s.done) return;
    s.done = true;
    if (outputs) s.outputs = std::move(*outputs);
    if (sole) s.sole_output = std::move(*sole);
    s.source_rank = source;
    if (s.ring) {
      s.ring->ended(s.ring_id, err, s.ended);
      s.ring.reset();
    }
    s.error = std::move(err);
    callbacks.swap(s.callbacks);
    relays = std::move(s.relays);
    s.relays = {};
  }
  // Published after the lock is released: a waiter polling it then takes
  // the lock without waiting for this thread (that contention would put
  // a futex wait and wake into most 4-byte point-to-point round trips).
  s.finished.store(true, std::memory_order_release);
  s.cv.notify_all();
  if (!elsewhere) elsewhere = relay_runner;
  if (!relays.empty()) {
    // Here, at once; what they complete hands its callbacks on as this did.
    const auto* outer = relay_runner;
    relay_runner = elsewhere;
    relays.for_each([&](const detail::relay& r) { r.fn(r.arg, w); });
    relay_runner = outer;
  }
  if (callbacks.empty()) return;
  if (elsewhere) {
    (*elsewhere)([w, cbs = std::move(callbacks)] {
      for (auto& f : cbs) run_callback(f, w, *w.state());
    });
    return;
  }
  for (auto& f : callbacks) run_callback(f, w, s);
}

}  // namespace

namespace detail {

void complete_elsewhere(const work& w, tensor_list outputs, int source_rank,
                        const callback_runner& run) {
  finish(w, *w.state(), &outputs, nullptr, source_rank, nullptr, &run);
}

void fail_elsewhere(const work& w, std::exception_ptr error, const callback_runner& run) {
  finish(w, *w.state(), nullptr, nullptr, -1, std::move(error), &run);
}

void complete_with_one(const work& w, tensor output, int source_rank) {
  finish(w, *w.state(), nullptr, &output, source_rank, nullptr);
}

void complete_one_elsewhere(const work& w, tensor output, int source_rank,
                            const callback_runner& run) {
  finish(w, *w.state(), nullptr, &output, source_rank, nullptr, &run);
}

void complete_unseen(const work& w, tensor_list outputs, tensor sole) {
  auto& s = *w.state();
  if (s.done || s.ring || !s.callbacks.empty() || !s.relays.empty())
    return sole.defined() ? complete_with_one(w, std::move(sole)) : w.complete(std::move(outputs));
  s.done = true;
  if (sole.defined())
    s.sole_output = std::move(sole);
  else
    s.outputs = std::move(outputs);
  s.finished.store(true, std::memory_order_release);
}

std::size_t output_count(const work_state& s) {
  return s.sole_output.defined() ? 1 : s.outputs.size();
}

void append_outputs(const work_state& s, tensor_list& out) {
  if (s.sole_output.defined()) out.push_back(s.sole_output);
  out.insert(out.end(), s.outputs.begin(), s.outputs.end());
}

tensor_list outputs_of(const work_state& s) {
  tensor_list out;
  out.reserve(output_count(s));
  append_outputs(s, out);
  return out;
}

void on_complete_relay(const work& w, relay r) {
  auto& s = const_cast<work_state&>(*w.state());
  {
    std::lock_guard<std::mutex> g{s.mtx};
    if (!s.done) {
      s.relays.push_back(r);
      return;
    }
  }
  r.fn(r.arg, w);
}

namespace {

void offer_help_to(work_state& s, const std::shared_ptr<shared_task>& c) {
  work_state* whole = nullptr;
  {
    std::lock_guard<std::mutex> g{s.mtx};
    if (s.done) return;
    s.help = c;
    s.helpable.store(true, std::memory_order_release);
    whole = s.whole.load(std::memory_order_acquire);
  }
  s.cv.notify_all();  // a waiter asleep takes part too (a copy of megabytes outlasts its wake-up)
  if (whole) offer_help_to(*whole, c);
}

void withdraw_help_from(work_state& s, const shared_task* c) {
  work_state* whole = nullptr;
  {
    std::lock_guard<std::mutex> g{s.mtx};
    if (s.help.get() == c) {
      s.helpable.store(false, std::memory_order_relaxed);
      s.help.reset();
    }
    if (!s.done) whole = s.whole.load(std::memory_order_acquire);  // alive while s is pending
  }
  if (whole) withdraw_help_from(*whole, c);
}

}  // namespace

void offer_help(const work& w, const std::shared_ptr<shared_task>& c) {
  offer_help_to(const_cast<work_state&>(*w.state()), c);
}

void withdraw_help(const work& w, const shared_task* c) {
  withdraw_help_from(const_cast<work_state&>(*w.state()), c);
}

bool lend_a_hand(work_state& s, const shared_task*& helped) {
  std::shared_ptr<shared_task> c;
  {
    std::lock_guard<std::mutex> g{s.mtx};
    if (!s.help || s.help.get() == helped) return false;
    c = s.help;
  }
  helped = c.get();
  c->take_part();
  return true;
}

}  // namespace detail

void work::complete(tensor_list outputs, int source_rank) const {
  finish(*this, const_cast<work_state&>(checked(state_)), &outputs, nullptr, source_rank, nullptr);
}

void work::fail(std::exception_ptr error) const {
  finish(*this, const_cast<work_state&>(checked(state_)), nullptr, nullptr, -1, std::move(error));
}

void work::set_sequence_number(std::uint64_t seq) const {
  const_cast<work_state&>(checked(state_)).seq.store(seq, std::memory_order_release);
}

namespace {

/// The count of a when_all: completes the whole when its last part
/// completed, or fails it with the first failure. Kept alive by itself
/// (`self`) until its last part relayed, and as the whole's driver (waiting
/// for the whole drives the parts that move in the waiting thread); the
/// parts' relays hold it by a plain pointer (they allocate nothing). One
/// block from the thread's shelves: the count and the driver apart were two
/// trips through malloc and free per batch_isend_irecv.
struct joint final : detail::work_driver {
  std::atomic<std::size_t> left{0};
  std::atomic<bool> failed{false};
  work all;
  std::vector<work> parts;  // not changed once the relays are registered
  std::shared_ptr<joint> self;
  bool given = false;  // the whole completes with `outputs`, not the parts' outputs
  tensor_list outputs;

  static void relay(void* arg, const work& done) {
    auto* j = static_cast<joint*>(arg);
    // The part is done: its error was set with `done`, before its relays
    // ran, and never changes after (no lock to read it). A failure is
    // published before this part counts down: the last part's relay then
    // sees it, and the whole's failure comes first.
    if (const auto& e = done.state()->error; e && !j->failed.exchange(true)) j->all.fail(e);
    if (j->left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    const auto keep = std::move(j->self);
    auto all = std::move(j->all);  // the whole no longer keeps itself alive
    if (j->failed.load()) return;
    if (j->given) return all.complete(std::move(j->outputs));
    // Every part is done: its outputs no longer change.
    std::size_t n = 0;
    for (auto& q : j->parts) n += detail::output_count(*q.state());
    tensor_list out;
    out.reserve(n);
    for (auto& q : j->parts) detail::append_outputs(*q.state(), out);
    all.complete(std::move(out));
  }

  void drive(work_state& s, std::chrono::steady_clock::time_point until) const override {
    for (auto& p : parts)
      if (auto& ps = *p.state(); ps.driver && !ps.finished.load(std::memory_order_acquire))
        ps.driver->drive(ps, until);
    poll_for_done(s, until);
  }
  bool poke() const override {
    bool moved = false;
    for (auto& p : parts)
      if (auto& ps = *p.state(); ps.driver && !ps.finished.load(std::memory_order_acquire))
        moved = ps.driver->poke() || moved;
    return moved;
  }
};

}  // namespace

namespace detail {

namespace {

work join_parts(work all, std::vector<work> parts, tensor_list* outputs) {
  if (parts.empty()) {
    all.complete(outputs ? std::move(*outputs) : tensor_list{});
    return all;
  }
  if (auto seq = parts.back().sequence_number()) all.set_sequence_number(seq);
  auto j = std::allocate_shared<joint>(recycling_allocator<joint>{});
  j->left = parts.size();
  j->all = all;
  j->parts = std::move(parts);
  j->self = j;
  if (outputs) {
    j->given = true;
    j->outputs = std::move(*outputs);
  }
  if (std::any_of(j->parts.begin(), j->parts.end(),
                  [](const work& p) { return static_cast<bool>(p.state()->driver); }))
    all.state()->driver = j;
  // The bookkeeping runs where a part completes (no hand-over to another
  // thread for it); the whole's own callbacks go where the part's would.
  // A relay may run at once: the joint is complete first.
  if (detail::timed_here()) {  // waiting for the whole waits for the parts in virtual time
    std::vector<const work_state*> states;
    for (auto& p : j->parts) states.push_back(p.state().get());
    detail::sim_joined(all.state(), states);
  }
  auto* raw = j.get();
  for (auto& p : raw->parts) {
    // A copy that a part's operation shares with its waiters is offered to
    // the whole's too (kernels/shared_copy.hpp); the joint keeps the whole
    // until the part's relay, so no lock and no count for it.
    p.state()->whole.store(all.state().get(), std::memory_order_release);
    on_complete_relay(p, {&joint::relay, raw});
  }
  return all;
}

}  // namespace

work join(work all, std::vector<work> parts) {
  return join_parts(std::move(all), std::move(parts), nullptr);
}

work join(work all, std::vector<work> parts, tensor_list outputs) {
  return join_parts(std::move(all), std::move(parts), &outputs);
}

}  // namespace detail

work work::when_all(std::string op, std::string group, std::vector<work> parts) {
  return detail::join(make(std::move(op), std::move(group)), std::move(parts));
}

}  // namespace troupe
