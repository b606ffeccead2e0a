// process_group: membership, backends by device, sequence numbers, the
// record of what was issued (flight record, pending works, completion
// hooks), coalescing and teardown. Each call validates its arguments once
// and dispatches by device: collectives in process_group_collectives.cpp,
// point-to-point in process_group_p2p.cpp.

#include "troupe/process_group.hpp"

#include <atomic>
#include <mutex>

#include "base/flight_ring.hpp"
#include "base/sim_conductor.hpp"
#include "base/work_state.hpp"
#include "troupe/error.hpp"

namespace troupe {

struct process_group::issued_state {
  std::mutex mtx;
  std::vector<std::weak_ptr<detail::work_state>> pending;  // issued, maybe finished
  std::function<void(const work_info&)> hook;
  std::atomic<bool> hooked{false};  // `hook` is set (read without the lock)
  /// The flight record (null: off). Set at most once, never cleared: a
  /// call reads `recording` (one atomic load; std::atomic_load of a
  /// shared_ptr takes a process-wide hashed lock) and then `ring`.
  std::shared_ptr<detail::flight_ring> ring;
  std::atomic<bool> recording{false};

  /// Sets the flight record unless there is one.
  void record_into(std::shared_ptr<detail::flight_ring> r) {
    std::lock_guard<std::mutex> g{mtx};
    if (recording.load()) return;
    ring = std::move(r);
    recording.store(true, std::memory_order_release);
  }
  /// The flight record, or null.
  const detail::flight_ring* recorder() const {
    return recording.load(std::memory_order_acquire) ? ring.get() : nullptr;
  }
};

namespace {

/// Has `w` write its end into `ring` (now, if it already ended).
void attach_record(const work& w, const std::shared_ptr<detail::flight_ring>& ring,
                   std::uint64_t id) {
  auto& s = *w.state();
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> g{s.mtx};
    if (!s.done) {
      s.ring = ring;
      s.ring_id = id;
      return;
    }
    err = s.error;
  }
  ring->ended(id, err);
}

}  // namespace

process_group::process_group(std::string name, std::string description, int rank,
                             std::vector<int> global_ranks,
                             std::map<device_type, std::shared_ptr<backend>> backends,
                             std::map<device_type, std::string> unavailable,
                             std::chrono::milliseconds timeout)
    : name_(std::move(name)),
      description_(description.empty() ? name_ : std::move(description)),
      rank_(rank),
      global_ranks_(std::move(global_ranks)),
      timeout_(timeout),
      backends_(std::move(backends)),
      unavailable_(std::move(unavailable)),
      issued_(std::make_shared<issued_state>()) {
  for (auto& [d, b] : backends_)
    if (b) by_type_.emplace(backend_type_of(b->name()), b);
  if (const auto n = detail::flight_ring::default_capacity(); n > 0 && rank_ >= 0)
    issued_->record_into(std::make_shared<detail::flight_ring>(name_, rank_, size(), n));
}

process_group::~process_group() = default;

void process_group::check_member(const char* op) const {
  // In troupe::testing::simulate, every call is a turn of the schedule.
  if (auto* sim = detail::sim_here()) sim->call(detail::sim_rank_here(), op);
  if (!released_.empty())
    throw error(errc::group,
                std::string(op) + ": group '" + name_ + "' was destroyed (" + released_ + ")");
  if (rank_ < 0) {
    std::string ranks;
    for (auto r : global_ranks_) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    throw error(errc::group, std::string(op) + ": this rank is not part of group '" + name_ +
                                 "' (ranks [" + ranks +
                                 "]); only members may call collectives on it");
  }
}

backend& process_group::get_backend(device_type d) const {
  auto i = backends_.find(d);
  if (i == backends_.end() || !i->second)
    throw error(errc::backend,
                "group '" + name_ + "' has no backend for device type " + to_string(d));
  return *i->second;
}

backend& process_group::get_backend(backend_type t) const {
  auto i = by_type_.find(t);
  if (i == by_type_.end() || !i->second)
    throw error(errc::backend, std::string("Could not find backend type ") + to_string(t) +
                                   ". (group '" + name_ + "')");
  return *i->second;
}

std::int64_t process_group::get_id() const noexcept {
  return static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(this));
}

std::int64_t process_group::get_backend_id(backend_type t) const {
  return static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&get_backend(t)));
}

std::int64_t process_group::get_backend_id(device_type d) const {
  return static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&get_backend(d)));
}

std::vector<device_type> process_group::get_device_types() const {
  std::vector<device_type> types;
  for (auto& [d, b] : backends_)  // a std::map: in device_type order
    if (b) types.push_back(d);
  return types;
}

backend& process_group::get_default_backend() const {
  return tensorless_backend();
}

backend_type process_group::get_backend_type() const {
  if (backends_.empty()) return backend_type::undefined;
  return backend_type_of(tensorless_backend().name());
}

void process_group::set_backend(device_type d, backend_type t, std::shared_ptr<backend> b) {
  if (!b)
    throw error(errc::invalid_argument, "set_backend: null backend for device type " +
                                            std::string(to_string(d)) + " of group '" + name_ +
                                            "'");
  if (t == backend_type::undefined)
    throw error(errc::invalid_argument,
                "set_backend: backend type undefined for group '" + name_ + "'");
  backends_[d] = b;
  unavailable_.erase(d);
  by_type_[t] = std::move(b);
}

std::string process_group::backend_name() const {
  std::string first, all;
  bool same = true;
  for (auto& [d, b] : backends_) {
    if (!b) continue;
    if (first.empty()) first = b->name();
    same = same && b->name() == first;
    all += (all.empty() ? "" : ",") + std::string(to_string(d)) + ":" + b->name();
  }
  return same ? first : all;
}

void process_group::set_name(std::string name) {
  if (name.empty())
    throw error(errc::invalid_argument, "set_name: empty name for group '" + name_ + "'");
  name_ = std::move(name);
}

void process_group::set_description(std::string description) {
  description_ = std::move(description);
}

void process_group::set_bound_device(std::optional<device> d) {
  if (d && d->index < 0)
    throw error(errc::invalid_argument, "set_bound_device: device " + to_string(*d) +
                                            " must have an index (group '" + name_ + "')");
  bound_device_ = d;
}

void process_group::check_sequence_numbers(const char* op) const {
  check_member(op);
  const auto t = get_backend_type();
  if (t != backend_type::actor && t != backend_type::nccl)
    throw error(errc::backend,
                "ProcessGroup " + backend_name() + " does not yet support sequence numbers.");
}

void process_group::set_sequence_number_for_group() {
  check_sequence_numbers("set_sequence_number_for_group");
}

std::uint64_t process_group::get_sequence_number_for_group() const {
  check_sequence_numbers("get_sequence_number_for_group");
  return tensorless_backend().sequence_number();
}

backend& process_group::tensorless_backend() const {
  // The CPU's backend, or (a group on "nccl" alone) the one it has, as
  // ProcessGroupNCCL runs barrier on the GPU.
  if (auto i = backends_.find(device_type::cpu); i != backends_.end() && i->second)
    return *i->second;
  for (auto& kv : backends_)
    if (kv.second) return *kv.second;
  return get_backend(device_type::cpu);  // throws, naming the group
}

backend& process_group::backend_for(const char* op, std::span<const tensor> ts) const {
  auto d = ts.empty() ? device_type::cpu : ts.front().get_device().type;
  auto i = backends_.find(d);
  if (i != backends_.end() && i->second) return *i->second;
  if (auto u = unavailable_.find(d); u != unavailable_.end()) {
    std::string known;
    for (auto& n : available_backends()) known += (known.empty() ? "" : ", ") + n;
    throw error(errc::backend, std::string(op) + ": group '" + name_ + "' runs device type " +
                                   to_string(d) + " on backend '" + u->second +
                                   "', which is not registered in this build (available: " + known +
                                   ")");
  }
  throw error(errc::backend, std::string(op) + ": group '" + name_ +
                                 "' has no backend for device type " + to_string(d));
}

void process_group::call_size::add(const tensor& t) {
  if (tensors++ == 0 && t.defined()) type = t.scalar_type();
  if (!t.defined()) return;
  numel += t.numel();
  bytes += t.nbytes();
}

work process_group::track(work w, const char* op, std::span<const tensor> ts, int peer) {
  call_size size;
  for (auto& t : ts) size.add(t);
  return track_sized(std::move(w), op, size, peer);
}

work process_group::track_sized(work w, const char* op, const call_size& size, int peer) {
  if (coalescing_) coalesced_.push_back(w);
  if (!w.valid()) return w;
  if (detail::timed_here())
    detail::sim_issued(w.state(), {op, name_, global_ranks_, rank_, size.bytes, peer, {}});
  const auto& s = *w.state();
  auto& st = *issued_;
  if (st.recorder()) {
    auto& ring = st.ring;
    // Completed already (its error, set before `finished`, is seen with it):
    // recorded with its end at once, in one step.
    const bool completed = s.finished.load(std::memory_order_acquire) && !s.error;
    const auto id = ring->record(op, w.sequence_number(), size.numel, size.bytes, size.type,
                                 size.tensors, peer, s.issued, completed);
    if (!completed) attach_record(w, ring, id);
  }
  // A work that already finished joins no list; without a hook there is
  // nothing else to do under the lock.
  if (s.finished.load(std::memory_order_acquire) && !st.hooked.load(std::memory_order_acquire))
    return w;
  std::function<void(const work_info&)> hook;
  {
    std::lock_guard<std::mutex> g{st.mtx};
    // A work that already finished (its peers were there first, or the group
    // has one rank) is not pending. Finished works leave the list now and
    // then (amortized: a scan per as many calls as the list held).
    if (!s.finished.load(std::memory_order_acquire)) {
      if (st.pending.size() >= 64 && st.pending.size() == st.pending.capacity())
        std::erase_if(st.pending, [](const std::weak_ptr<detail::work_state>& p) {
          auto q = p.lock();
          return !q || q->finished.load(std::memory_order_acquire);
        });
      st.pending.push_back(w.state());
    }
    if (st.hook) hook = st.hook;
  }
  if (hook) {
    const auto wall = std::chrono::system_clock::now();
    const auto started = std::chrono::steady_clock::now();
    w.on_complete([hook = std::move(hook), wall, started](const work& done) {
      work_info i;
      i.op = done.op_name();
      i.seq = done.sequence_number();
      i.active_duration = std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now() - started);
      i.time_started = wall;
      i.time_finished =
          wall + std::chrono::duration_cast<std::chrono::system_clock::duration>(i.active_duration);
      i.success = done.is_success();
      hook(i);
    });
  }
  return w;
}

void process_group::register_on_completion_hook(std::function<void(const work_info&)> hook) {
  check_member("register_on_completion_hook");
  if (!hook) throw error(errc::invalid_argument, "register_on_completion_hook: the hook is empty");
  std::lock_guard<std::mutex> g{issued_->mtx};
  if (issued_->hook)
    throw error(errc::invalid_argument,
                "register_on_completion_hook: group '" + name_ +
                    "' already has an on-completion hook (one per group, as c10d's)");
  issued_->hook = std::move(hook);
  issued_->hooked.store(true, std::memory_order_release);
}

bool process_group::has_hooks() const noexcept {
  return issued_->hooked.load(std::memory_order_acquire);
}

void process_group::enable_collectives_timing() {
  check_member("enable_collectives_timing");
  if (!issued_->recorder())
    issued_->record_into(std::make_shared<detail::flight_ring>(name_, rank_, size(), 2000));
}

std::vector<flight_entry> process_group::flight_record() const {
  const auto* ring = issued_->recorder();
  return ring ? ring->entries() : std::vector<flight_entry>{};
}

void process_group::wait_for_pending_works() {
  check_member("wait_for_pending_works");
  std::vector<std::weak_ptr<detail::work_state>> pending;
  {
    std::lock_guard<std::mutex> g{issued_->mtx};
    pending = issued_->pending;
  }
  std::exception_ptr first;
  for (auto& p : pending)
    if (auto s = p.lock()) try {
        work::attach(s).wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
  if (first) std::rethrow_exception(first);
}

std::uint64_t process_group::sequence_number() const {
  check_member("sequence_number");
  return tensorless_backend().sequence_number();
}

// -- coalescing ------------------------------------------------------------------------

void process_group::start_coalescing() {
  check_member("start_coalescing");
  if (coalescing_)
    throw error(errc::invalid_argument,
                "start_coalescing: group '" + name_ + "' is already coalescing");
  coalescing_ = true;
  coalesced_.clear();
}

work process_group::end_coalescing() {
  check_member("end_coalescing");
  if (!coalescing_)
    throw error(errc::invalid_argument,
                "end_coalescing: group '" + name_ + "' has no start_coalescing() pending");
  coalescing_ = false;
  return work::when_all("coalesced", name_, std::move(coalesced_));
}

void process_group::abort(const std::string& reason) {
  for (auto& kv : backends_)
    if (kv.second) kv.second->abort(reason);
}

void process_group::release(const std::string& reason) {
  abort(reason);
  backends_.clear();
  by_type_.clear();  // the last references: a backend ends with its group, not after
  released_ = reason;
}

}  // namespace troupe
