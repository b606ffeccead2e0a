// The NCCL state of one group: communicators and launching (the design is
// in backends/nccl_group.hpp).

#include "backends/nccl_group.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "actors/rank_runtime.hpp"
#include "actors/thread_logger.hpp"
#include "backends/nccl_launch.hpp"
#include "base/texts.hpp"

namespace troupe::detail::nccl {

namespace {

/// How often a communicator that is being set up is polled.
constexpr auto init_poll_interval = std::chrono::milliseconds(1);
/// How long the destructor waits for the device actor to release the communicators.
constexpr auto teardown_wait = std::chrono::seconds(10);

}  // namespace

// -- communicators ------------------------------------------------------------------

/// A call issued while its communicator was still being set up.
struct held_job {
  gpu::device_job job;
  clock::time_point since;
};

/// One NCCL communicator of the group: the group's own, or a pair's.
struct communicator {
  std::string key;    ///< "0" for the group's, "lo:hi" for a pair's
  int nranks = 1;     ///< ranks in the communicator
  int rank = 0;       ///< this rank in the communicator
  int publisher = 0;  ///< the group rank that makes the unique id
  int device = 0;
  std::string label;          ///< "GROUP/KEY" (NCCL's commName)
  const char* first_op = "";  ///< the call that created it (for messages)
  timeout_t init_timeout{};
  clock::time_point init_deadline;
  std::atomic<bool> ready{false};         ///< set up: calls go straight to the device actor
  std::atomic<bool> settled{false};       ///< ready or failed: the set-up poll stops
  std::atomic<bool> probe_queued{false};  ///< a set-up probe waits in the device actor
  std::vector<held_job> held;             ///< under nccl_group::mtx_
  ncclComm_t comm = nullptr;              ///< touched by device-actor jobs only

  std::string store_key() const { return "nccl/uid/" + key; }
};

nccl_group::nccl_group(const backend_context& ctx)
    : rt_(runtime_of(ctx)),
      store_(ctx.store),
      rank_(ctx.rank),
      size_(ctx.size),
      group_(ctx.group_name),
      timeout_(ctx.timeout) {}

// -- the caller's side -------------------------------------------------------------

int nccl_group::bind(const char* op, const tensor_list& ts) {
  std::lock_guard<std::mutex> g{mtx_};
  for (auto& t : ts) {
    if (!t.defined()) continue;
    const auto& d = t.get_device();
    if (d.type != device_type::cuda)
      refuse(op, "the nccl backend takes cuda tensors, not " + t.describe());
    if (device_ < 0) use_device(d.index);
    if (d.index != device_)
      refuse(op, "group '" + group_ + "' runs NCCL on cuda:" + std::to_string(device_) +
                     " (its communicator was created there), but this call has a tensor on " +
                     to_string(d) + " (" + t.describe() + ")");
  }
  if (device_ < 0) use_device(guess_device(op));
  return device_;
}

work nccl_group::issue(const char* op, int peer, plan p, tensor_list outputs, timeout_t t,
                       int source) {
  if (t == use_group_timeout) t = timeout_;
  std::shared_ptr<communicator> c;
  try {
    c = communicator_for(op, peer);
  } catch (const error& e) {
    mark_broken(e.code(), e.what(), false);
    return work::failed(op, group_, std::current_exception());
  }
  auto user = work::make(op, group_);
  auto job = call_job(op, c, std::make_shared<plan>(std::move(p)), t);
  job.outputs = std::move(outputs);
  job.handle = source < 0 ? user : forwarded(user, op, source);
  if (!enqueue(*c, std::move(job), user)) user.fail(std::make_exception_ptr(refusal(op)));
  return user;
}

std::uint64_t nccl_group::sequence() const {
  std::lock_guard<std::mutex> g{mtx_};
  return issued_;
}

void nccl_group::abort(const std::string& reason) {
  mark_broken(errc::aborted, "aborted: " + reason, true);
  submit_teardown(true);
}

void nccl_group::shutdown() {
  bool was_broken = false;
  {
    std::lock_guard<std::mutex> g{mtx_};
    was_broken = broken_.has_value();
  }
  // Calls still running, or a group that broke before (its communicators may
  // wait for peers): abort rather than destroy, which would wait for them.
  const bool unfinished = mark_broken(errc::aborted, "the group was destroyed", true);
  auto done = submit_teardown(unfinished || was_broken);
  if (done.valid() && std::this_thread::get_id() != actor_thread_.load()) {
    try {
      done.wait(teardown_wait);
    } catch (...) {
      // the device actor is gone or late: nothing more to release from here
    }
  }
  // Jobs still in the device actor hold this state: let go of the actor.
  std::lock_guard<std::mutex> g{mtx_};
  queue_.reset();
}

rank_runtime& nccl_group::runtime_of(const backend_context& ctx) {
  if (!ctx.runtime)
    throw error(errc::backend,
                "backend 'nccl' for group '" + ctx.group_name + "' needs the rank's actor runtime");
  return *static_cast<rank_runtime*>(ctx.runtime);
}

int nccl_group::guess_device(const char* op) const {
  const int n = cuda_device_count();
  if (n == 0)
    throw error(errc::backend,
                std::string(op) + ": no CUDA device is usable (" + cuda_status() + ")");
  return rank_ % n;
}

void nccl_group::use_device(int device) {
  queue_ = gpu::device_queue_of(rt_, device);
  device_ = device;
}

std::shared_ptr<communicator> nccl_group::communicator_for(const char* op, int peer) {
  const auto t = timeout_;
  {
    // A communicator that exists needs no wait behind another one's set-up.
    std::lock_guard<std::mutex> g{mtx_};
    if (broken_) throw refusal_locked(op);
    if (auto i = comms_.find(describe(op, peer, t)->key); i != comms_.end()) return i->second;
  }
  std::lock_guard<std::mutex> create{create_mtx_};
  std::shared_ptr<communicator> c;
  {
    std::lock_guard<std::mutex> g{mtx_};
    if (broken_) throw refusal_locked(op);
    c = describe(op, peer, t);
    if (auto i = comms_.find(c->key); i != comms_.end()) return i->second;
  }
  std::optional<bytes> uid;
  if (rank_ != c->publisher) uid = fetch_uid(op, *c, t);
  {
    std::lock_guard<std::mutex> g{mtx_};
    if (broken_) throw refusal_locked(op);
    comms_.emplace(c->key, c);
    queue_->submit(internal_job(op, [self = shared_from_this(), c, uid] { self->start(*c, uid); }));
  }
  watch_init(c);
  return c;
}

std::shared_ptr<communicator> nccl_group::describe(const char* op, int peer, timeout_t t) const {
  auto c = std::make_shared<communicator>();
  c->device = device_;
  if (peer == whole_group) {
    c->key = "0";
    c->nranks = size_;
    c->rank = rank_;
    c->publisher = 0;
  } else {
    const int lo = std::min(rank_, peer), hi = std::max(rank_, peer);
    c->key = std::to_string(lo) + ":" + std::to_string(hi);
    c->nranks = 2;
    c->rank = rank_ == lo ? 0 : 1;
    c->publisher = lo;
  }
  c->label = group_ + "/" + c->key;
  c->first_op = op;
  c->init_timeout = t;
  c->init_deadline = deadline_after(t);
  return c;
}

bytes nccl_group::fetch_uid(const char* op, const communicator& c, timeout_t t) const {
  const auto key = c.store_key();
  const auto who = "rank " + std::to_string(c.publisher);
  try {
    store_->wait({key}, t);
    auto id = store_->get(key);
    if (id.size() == sizeof(ncclUniqueId)) return id;
    throw error(errc::backend, "the value has " + std::to_string(id.size()) + " bytes, not " +
                                   std::to_string(sizeof(ncclUniqueId)));
  } catch (const error& e) {
    if (e.code() == errc::timeout)
      throw error(errc::timeout, std::string(op) + ": group '" + group_ + "': " + who +
                                     " did not publish the NCCL unique id under store key '" + key +
                                     "' within " + in_ms(t) + " (" + e.what() + ")");
    throw error(e.code(), std::string(op) + ": group '" + group_ +
                              "': reading the NCCL unique id of " + who + " from store key '" +
                              key + "' failed: " + e.what());
  }
}

void nccl_group::watch_init(const std::shared_ptr<communicator>& c) {
  std::weak_ptr<nccl_group> weak = weak_from_this();
  thread_logger_release release;  // the caller's thread: see actors/thread_logger.hpp
  rt_.system().spawn([weak, c](caf::event_based_actor* self) -> caf::behavior {
    self->delayed_send(self, init_poll_interval, timeout_atom::value);
    return {[=](timeout_atom) {
      auto g = weak.lock();
      if (!g || c->settled || g->stopping_) return self->quit();
      g->submit_probe(c);
      self->delayed_send(self, init_poll_interval, timeout_atom::value);
    }};
  });
}

void nccl_group::submit_probe(const std::shared_ptr<communicator>& c) {
  std::lock_guard<std::mutex> g{mtx_};
  if (!queue_) return;  // shut down
  // One probe at a time: a busy device actor must not collect one per tick.
  if (c->probe_queued.exchange(true)) return;
  queue_->submit(internal_job(c->first_op, [self = shared_from_this(), c] { self->probe(*c); }));
}

gpu::device_job nccl_group::internal_job(const char* op, std::function<void()> fn) {
  gpu::device_job j;
  j.name = op;
  j.enqueue = [fn = std::move(fn)](gpu::stream_t) { fn(); };
  j.on_failure = [self = shared_from_this()](errc code, const std::string& why) {
    self->failed(code, why);
  };
  j.handle = work::make(op, group_);
  return j;
}

gpu::device_job nccl_group::call_job(const char* op, std::shared_ptr<communicator> c,
                                     std::shared_ptr<plan> p, timeout_t t) {
  auto self = shared_from_this();
  gpu::device_job j;
  j.name = op;
  j.enqueue = [self, c, p, op, t](gpu::stream_t s) { self->launch(op, *c, *p, s, t); };
  // Keeps the plan's memory until the stream passed the job, and refuses
  // the result once the group broke (an aborted NCCL kernel ends early).
  j.after = [self, p, op] {
    if (self->stopping_) throw self->refusal(op);
  };
  j.health = [self, c, op] { return self->health(op, *c); };
  j.on_failure = [self](errc code, const std::string& why) { self->failed(code, why); };
  j.timeout = t;
  return j;
}

work nccl_group::forwarded(const work& user, const char* op, int source) const {
  auto inner = work::make(op, group_);
  inner.on_complete([user, source](const work& w) {
    if (auto e = w.exception())
      user.fail(e);
    else
      user.complete(w.result(), source);
  });
  return inner;
}

bool nccl_group::enqueue(communicator& c, gpu::device_job job, const work& user) {
  std::lock_guard<std::mutex> g{mtx_};
  if (broken_) return false;
  user.set_sequence_number(++issued_);
  track(user);
  if (c.ready)
    queue_->submit(std::move(job));
  else
    c.held.push_back({std::move(job), clock::now()});
  return true;
}

void nccl_group::track(const work& w) {
  if (pending_.size() > 64) std::erase_if(pending_, [](const work& p) { return p.is_completed(); });
  pending_.push_back(w);
}

// -- the device actor's side ---------------------------------------------------------

void nccl_group::start(communicator& c, const std::optional<bytes>& uid) {
  actor_thread_ = std::this_thread::get_id();
  const char* op = c.first_op;
  if (stopping_) throw refusal(op);
  ncclUniqueId id{};
  if (uid) {
    std::memcpy(&id, uid->data(), sizeof id);
  } else {
    const auto r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) throw nccl_error(op, c.device, "ncclGetUniqueId", r);
    const auto* b = reinterpret_cast<const std::uint8_t*>(&id);
    store_->set(c.store_key(), bytes(b, b + sizeof id));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = c.label.c_str();
  const auto r = ncclCommInitRankConfig(&c.comm, c.nranks, id, c.rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (c.comm) ncclCommAbort(c.comm);
    c.comm = nullptr;
    throw nccl_error(op, c.device, "ncclCommInitRankConfig", r);
  }
  probe(c);
}

void nccl_group::probe(communicator& c) {
  c.probe_queued = false;
  const char* op = c.first_op;
  if (c.settled || stopping_ || !c.comm) return;
  ncclResult_t state = ncclInProgress;
  const auto r = ncclCommGetAsyncError(c.comm, &state);
  if (r != ncclSuccess) throw nccl_error(op, c.device, "ncclCommGetAsyncError", r);
  if (state == ncclSuccess) return open(c);
  if (state != ncclInProgress) throw nccl_error(op, c.device, "ncclCommInitRankConfig", state);
  if (clock::now() < c.init_deadline) return;
  // Break the group with errc::timeout at once (the failing probe job
  // would do the same through on_failure).
  error late(errc::timeout,
             std::string(op) + ": group '" + group_ + "': " + timeout_after(c.init_timeout) +
                 ": the NCCL communicator '" + c.label + "' on cuda:" + std::to_string(c.device) +
                 " was not set up (did every rank of it make the call?)");
  mark_broken(late.code(), late.what(), false);
  throw late;
}

void nccl_group::open(communicator& c) {
  std::lock_guard<std::mutex> g{mtx_};
  if (broken_) return;  // the held calls already failed
  c.ready = true;
  c.settled = true;
  const auto now = clock::now();
  for (auto& h : c.held) {
    if (h.job.timeout.count() > 0) {
      auto left = h.job.timeout - std::chrono::duration_cast<timeout_t>(now - h.since);
      h.job.timeout = std::max(left, timeout_t{1});
    }
    queue_->submit(std::move(h.job));
  }
  c.held.clear();
}

void nccl_group::launch(const char* op, communicator& c, const plan& p, gpu::stream_t s,
                        timeout_t t) {
  if (stopping_) throw refusal(op);
  nccl::launch(op, c.device, c.comm, s, stopping_, t, p);
}

std::string nccl_group::health(const char* op, const communicator& c) const {
  if (stopping_ || !c.comm) return refusal(op).what();
  return async_error(op, c);
}

std::string nccl_group::async_error(const char* op, const communicator& c) const {
  ncclResult_t state = ncclSuccess;
  const auto r = ncclCommGetAsyncError(c.comm, &state);
  if (r == ncclSuccess && (state == ncclSuccess || state == ncclInProgress)) return {};
  return nccl_error(op, c.device, "NCCL communicator of group '" + group_ + "'",
                    r != ncclSuccess ? r : state)
      .what();
}

void nccl_group::failed(errc code, const std::string& why) {
  mark_broken(code, why, false);
  for (auto& c : communicators())
    if (c->comm) {
      ncclCommAbort(c->comm);  // frees it; nothing more to do when even this fails
      c->comm = nullptr;
    }
}

void nccl_group::teardown(bool force) {
  for (auto& c : communicators()) {
    if (!c->comm) continue;
    const bool idle = !force && c->ready && async_error("destroy", *c).empty();
    if (idle)
      ncclCommDestroy(c->comm);
    else
      ncclCommAbort(c->comm);
    c->comm = nullptr;
  }
}

// -- both sides ------------------------------------------------------------------------

bool nccl_group::mark_broken(errc code, const std::string& why, bool fail_pending) {
  std::vector<work> doomed;
  std::vector<held_job> dropped;  // destroyed outside the lock
  bool unfinished = false;
  {
    std::lock_guard<std::mutex> g{mtx_};
    if (broken_) return false;
    broken_ = failure{code, why};
    stopping_ = true;
    for (auto& kv : comms_) {
      kv.second->settled = true;
      for (auto& h : kv.second->held) dropped.push_back(std::move(h));
      kv.second->held.clear();
    }
    for (auto& w : pending_)
      if (!w.is_completed()) {
        unfinished = true;
        if (fail_pending) doomed.push_back(w);
      }
  }
  for (auto& h : dropped) doomed.push_back(h.job.handle);
  for (auto& w : doomed)
    w.fail(std::make_exception_ptr(
        error(code, w.op_name() + " on group '" + group_ + "' failed: " + why)));
  return unfinished;
}

work nccl_group::submit_teardown(bool force) {
  std::lock_guard<std::mutex> g{mtx_};
  if (!queue_) return {};
  auto self = shared_from_this();
  auto j = internal_job("nccl teardown", [self, force] { self->teardown(force); });
  auto done = j.handle;
  queue_->submit(std::move(j));
  return done;
}

error nccl_group::refusal(const char* op) const {
  std::lock_guard<std::mutex> g{mtx_};
  return refusal_locked(op);
}

error nccl_group::refusal_locked(const char* op) const {
  const auto code = broken_ ? broken_->code : errc::aborted;
  const auto why = broken_ ? broken_->why : std::string("it is shutting down");
  return error(code, std::string(op) + ": group '" + group_ + "' can no longer be used: " + why);
}

std::vector<std::shared_ptr<communicator>> nccl_group::communicators() const {
  std::lock_guard<std::mutex> g{mtx_};
  std::vector<std::shared_ptr<communicator>> r;
  for (auto& kv : comms_) r.push_back(kv.second);
  return r;
}
}  // namespace troupe::detail::nccl
