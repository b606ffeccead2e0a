// The device actor (see actors/device_actor.hpp): a detached actor per (rank,
// CUDA device) that owns the rank's stream on the device.
//
//   submit  -> job message: make the device current, enqueue the job's work
//              (an internal step, with no work and nothing to run after it,
//              is done then), record an event and watch it for up to 1 ms
//              (TROUPE_GPU_WATCH_US) while no other message waits (a short job
//              then completes without a wake-up); else ask CUDA to call back
//              on the host when the stream gets there
//   done    -> the host callback's message: run `after`, complete the work
//   poll    -> every millisecond while jobs are pending: a failed event, a
//              failed health check or a passed deadline fails the job (a
//              stream that faulted may never call back)
//   abort   -> fail every pending job
// After a job message or a callback's, the actor polls its mailbox for the
// next message through the wait policy's poll window before it returns to
// CAF, whose thread would sleep: a caller that waits for each call before the
// next one then pays no thread wake-up per call.
// On exit it fails the jobs still pending and waits for its stream to drain,
// so that no callback outlives it, then destroys the stream.

#include "actors/device_actor.hpp"
#include "base/texts.hpp"
#include "base/wait_policy.hpp"

#include <map>
#include <thread>

#include "actors/actors.hpp"
#include "actors/rank_runtime.hpp"
#include "actors/thread_logger.hpp"
#include "memory/device_memory.hpp"
#include "troupe/error.hpp"

namespace troupe::detail::gpu {

namespace {

using job_ptr = device_job_ptr;
using clock = std::chrono::steady_clock;
constexpr auto poll_interval = std::chrono::milliseconds(1);

struct pending_job {
  job_ptr job;
  event_t event = nullptr;
  clock::time_point deadline = clock::time_point::max();
};

struct device_state {
  int device = -1;
  stream_t stream = nullptr;
  std::uint64_t next_id = 0;
  bool polling = false;
  std::map<std::uint64_t, pending_job> pending;

  ~device_state() {
    for (auto& kv : pending) destroy_event(device, kv.second.event);
    destroy_stream(device, stream);
  }
};

using self_ptr = detail::device_actor::stateful_pointer<device_state>;

/// What the CUDA host callback needs to tell the actor that job `id` is done.
struct callback_context {
  detail::device_actor actor;
  std::uint64_t id;
};

void on_stream_reached(void* p) {
  auto* c = static_cast<callback_context*>(p);
  caf::anon_send(c->actor, gpu_done_atom::value, c->id);
  delete c;
}

void fail_job(device_job& j, errc code, const std::string& reason) {
  if (j.on_failure) {
    try {
      j.on_failure(code, reason);
    } catch (...) {
      // the job fails with `reason` either way
    }
  }
  if (j.handle.valid()) j.handle.fail(std::make_exception_ptr(error(code, reason)));
}

void fail_job(device_job& j, const std::exception_ptr& e) {
  std::string reason = "unknown error";
  errc code = errc::backend;
  try {
    std::rethrow_exception(e);
  } catch (const error& x) {
    reason = x.what();
    code = x.code();
  } catch (const std::exception& x) {
    reason = x.what();
  } catch (...) {
  }
  fail_job(j, code, reason);
}

/// Removes job `id` from the pending ones (nullptr when it already left).
job_ptr take(self_ptr self, std::uint64_t id) {
  auto& st = self->state;
  auto i = st.pending.find(id);
  if (i == st.pending.end()) return nullptr;
  auto j = std::move(i->second.job);
  destroy_event(st.device, i->second.event);
  st.pending.erase(i);
  return j;
}

void finish(self_ptr self, std::uint64_t id) {
  auto j = take(self, id);
  if (!j) return;
  try {
    if (j->after) j->after();
    if (j->handle.valid()) j->handle.complete(std::move(j->outputs));
  } catch (...) {
    fail_job(*j, std::current_exception());
  }
}

void schedule_poll(self_ptr self) {
  if (self->state.polling || self->state.pending.empty()) return;
  self->state.polling = true;
  self->delayed_send(self, poll_interval, gpu_poll_atom::value);
}

/// Whether the stream passes `ev` within watch_limit, looking while no other
/// message waits for the actor. A host callback costs a thread hop and holds
/// the stream until it ran; a short job (a small NCCL call) ends sooner.
bool done_soon(self_ptr self, const char* op, event_t ev) {
  const auto until = clock::now() + wait_policy::get().gpu_watch;
  try {
    do {
      if (event_done(op, self->state.device, ev)) return true;
      std::this_thread::yield();  // ranks may outnumber cores
    } while (self->mailbox().empty() && clock::now() < until);
  } catch (...) {
    // a failed event: the poll fails the job
  }
  return false;
}

/// Polls the mailbox through the wait policy's window (spinning, then
/// yielding) until a message waits or the window is over.
void linger(self_ptr self) {
  const auto& policy = wait_policy::get();
  const auto start = clock::now();
  while (self->mailbox().empty() && policy.poll_step(clock::now() - start)) {
  }
}

void start(self_ptr self, const job_ptr& j) {
  auto& st = self->state;
  const char* op = j->name.c_str();
  event_t ev = nullptr;
  try {
    set_device(op, st.device);
    j->enqueue(st.stream);
    // An internal step (no work, nothing to run after it) is done once
    // issued: the job after it that a caller waits for sees any failure on
    // the stream. Watching it would put a host callback between the steps,
    // which holds the stream until the host ran it.
    if (!j->handle.valid() && !j->after) return;
    ev = create_event(op, st.device);
    record(op, st.device, ev, st.stream);
  } catch (...) {
    destroy_event(st.device, ev);
    fail_job(*j, std::current_exception());
    return;
  }
  const auto id = ++st.next_id;
  pending_job p{j, ev};
  if (j->timeout.count() > 0) p.deadline = j->submitted + j->timeout;
  st.pending.emplace(id, std::move(p));
  if (done_soon(self, op, ev)) return finish(self, id);
  auto* ctx = new callback_context{caf::actor_cast<detail::device_actor>(self), id};
  try {
    on_host(op, st.device, st.stream, &on_stream_reached, ctx);
  } catch (...) {
    delete ctx;  // the poll still finds the event done
  }
  schedule_poll(self);
}

/// Checks every pending job: finished (the callback may be late or never
/// come), failed, unhealthy or late.
void poll(self_ptr self) {
  auto& st = self->state;
  st.polling = false;
  const auto now = clock::now();
  std::vector<std::uint64_t> ids;
  for (auto& kv : st.pending) ids.push_back(kv.first);
  for (auto id : ids) {
    auto i = st.pending.find(id);
    if (i == st.pending.end()) continue;
    auto& p = i->second;
    const char* op = p.job->name.c_str();
    try {
      if (event_done(op, st.device, p.event)) {
        finish(self, id);
        continue;
      }
    } catch (...) {
      auto j = take(self, id);
      fail_job(*j, std::current_exception());
      continue;
    }
    std::string sick = p.job->health ? p.job->health() : std::string();
    if (!sick.empty()) {
      auto j = take(self, id);
      fail_job(*j, errc::backend, sick);
    } else if (now >= p.deadline) {
      auto j = take(self, id);
      fail_job(*j, errc::timeout,
               j->name + ": " + detail::timeout_after(j->timeout) + " on cuda:" +
                   std::to_string(st.device) + " (the device did not finish the work)");
    }
  }
  schedule_poll(self);
}

/// Fails every pending job with errc::aborted and `reason`.
void fail_all(self_ptr self, const std::string& reason) {
  auto& st = self->state;
  while (!st.pending.empty()) {
    auto j = take(self, st.pending.begin()->first);
    fail_job(*j, errc::aborted,
             j->name + " on cuda:" + std::to_string(st.device) + " failed: " + reason);
  }
}

detail::device_actor::behavior_type device_actor_behavior(self_ptr self, int device,
                                                          stream_t stream) {
  self->state.device = device;
  self->state.stream = stream;
  self->set_exit_handler([self](caf::exit_msg& m) {
    // Works still pending fail; the stream drains, so that no host callback
    // refers to this actor later.
    fail_all(self, "the rank's device actor stopped (its world is shutting down)");
    synchronize_quietly(self->state.device, self->state.stream);
    self->quit(m.reason);
  });
  return {
      [=](gpu_job_atom, const job_ptr& j) {
        start(self, j);
        linger(self);
      },
      [=](gpu_done_atom, std::uint64_t id) {
        finish(self, id);
        linger(self);
      },
      [=](gpu_poll_atom) { poll(self); },
      [=](gpu_abort_atom, const std::string& reason) { fail_all(self, reason); },
  };
}

class queue_impl final : public device_queue {
 public:
  queue_impl(detail::device_actor a, int device) : actor_(std::move(a)), device_(device) {}
  ~queue_impl() override { caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown); }
  int device() const noexcept override { return device_; }
  void submit(device_job job) override {
    job.submitted = clock::now();
    caf::anon_send(actor_, gpu_job_atom::value, std::make_shared<device_job>(std::move(job)));
  }
  void abort(const std::string& reason) override {
    caf::anon_send(actor_, gpu_abort_atom::value, reason);
  }

 private:
  detail::device_actor actor_;
  int device_;
};

}  // namespace

std::shared_ptr<device_queue> device_queue_of(rank_runtime& rt, int device) {
  auto slot = rt.attachment("cuda:" + std::to_string(device), [&]() -> std::shared_ptr<void> {
    check_device("device actor", troupe::device::cuda(device));
    auto stream = create_stream("device actor", device);
    auto a = rt.system().spawn<caf::detached>(device_actor_behavior, device, stream);
    release_thread_logger();  // the caller's thread: see actors/thread_logger.hpp
    return std::make_shared<queue_impl>(a, device);
  });
  return std::static_pointer_cast<device_queue>(std::static_pointer_cast<queue_impl>(slot));
}

}  // namespace troupe::detail::gpu
