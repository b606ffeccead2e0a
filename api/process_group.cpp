// process_group: one validation point per call, then dispatch by device.

#include "troupe/process_group.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>

#include "api/validate.hpp"
#include "base/flight_ring.hpp"
#include "base/sim_conductor.hpp"
#include "base/work_state.hpp"
#include "troupe/error.hpp"

namespace troupe {

using detail::validator;

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
                             std::map<device_type, std::string> unavailable)
    : name_(std::move(name)),
      description_(description.empty() ? name_ : std::move(description)),
      rank_(rank),
      global_ranks_(std::move(global_ranks)),
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

backend& process_group::backend_for(const char* op, const tensor_list& ts) const {
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

work process_group::track(work w, const char* op, const tensor_list& ts, int peer) {
  if (coalescing_) coalesced_.push_back(w);
  if (!w.valid()) return w;
  const auto& s = *w.state();
  auto& st = *issued_;
  if (st.recorder()) {
    auto& ring = st.ring;
    std::int64_t numel = 0;
    std::uint64_t bytes = 0;
    for (auto& t : ts)
      if (t.defined()) {
        numel += t.numel();
        bytes += t.nbytes();
      }
    const auto type = !ts.empty() && ts[0].defined() ? ts[0].scalar_type() : dtype::float32;
    // Completed already (its error, set before `finished`, is seen with it):
    // recorded with its end at once, in one step.
    const bool completed = s.finished.load(std::memory_order_acquire) && !s.error;
    const auto id = ring->record(op, w.sequence_number(), numel, bytes, type,
                                 static_cast<int>(ts.size()), peer, s.issued, completed);
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

// -- collectives ---------------------------------------------------------------

work process_group::broadcast(tensor_list ts, const broadcast_options& o) {
  check_member("broadcast");
  validator v{"broadcast", rank_, size()};
  v.tensors(ts, "tensors");
  v.rank_arg(o.root_rank, "root_rank");
  if (o.root_tensor < 0 || o.root_tensor >= static_cast<int>(ts.size()))
    v.fail("root_tensor " + std::to_string(o.root_tensor) + " is out of range for " +
           std::to_string(ts.size()) + " tensor(s)");
  for (auto& t : ts) v.numel(t.numel(), ts[0].numel(), "a tensor");
  return track(backend_for("broadcast", ts).broadcast(ts, o), "broadcast", ts, -1);
}

work process_group::allreduce(tensor_list ts, const allreduce_options& o) {
  check_member("allreduce");
  validator v{"allreduce", rank_, size()};
  v.tensors(ts, "tensors");
  for (auto& t : ts) v.numel(t.numel(), ts[0].numel(), "a tensor");
  check_reduce_supported("allreduce", o.op, ts[0].scalar_type());
  return track(backend_for("allreduce", ts).allreduce(ts, o), "allreduce", ts, -1);
}

work process_group::allreduce_coalesced(tensor_list ts, const allreduce_coalesced_options& o) {
  check_member("allreduce_coalesced");
  validator v{"allreduce_coalesced", rank_, size()};
  v.tensors(ts, "tensors");
  check_reduce_supported("allreduce_coalesced", o.op, ts[0].scalar_type());
  return track(backend_for("allreduce_coalesced", ts).allreduce_coalesced(ts, o),
               "allreduce_coalesced", ts, -1);
}

work process_group::reduce(tensor_list ts, const reduce_options& o) {
  check_member("reduce");
  validator v{"reduce", rank_, size()};
  v.tensors(ts, "tensors");
  v.rank_arg(o.root_rank, "root_rank");
  if (o.root_tensor < 0 || o.root_tensor >= static_cast<int>(ts.size()))
    v.fail("root_tensor " + std::to_string(o.root_tensor) + " is out of range for " +
           std::to_string(ts.size()) + " tensor(s)");
  for (auto& t : ts) v.numel(t.numel(), ts[0].numel(), "a tensor");
  check_reduce_supported("reduce", o.op, ts[0].scalar_type());
  return track(backend_for("reduce", ts).reduce(ts, o), "reduce", ts, -1);
}

work process_group::allgather(std::vector<tensor_list> outs, tensor_list ins,
                              const allgather_options& o) {
  check_member("allgather");
  validator v{"allgather", rank_, size()};
  v.tensors(ins, "input_tensors");
  v.length(outs.size(), ins.size(), "output_tensors (one list per input)");
  for (std::size_t i = 0; i < outs.size(); ++i) {
    v.length(outs[i].size(), static_cast<std::size_t>(size()), "output_tensors[i]");
    v.tensors(outs[i], "output_tensors[i]");
    v.same_dtype(outs[i], ins[i]);
    for (auto& t : outs[i]) v.numel(t.numel(), ins[i].numel(), "an output tensor");
  }
  return track(backend_for("allgather", ins).allgather(outs, ins, o), "allgather", ins, -1);
}

work process_group::allgather(tensor_list outs, tensor in, const allgather_options& o) {
  return allgather(std::vector<tensor_list>{std::move(outs)}, tensor_list{std::move(in)}, o);
}

work process_group::allgather_into_tensor(tensor out, tensor in, const allgather_options& o) {
  check_member("allgather_into_tensor");
  validator v{"allgather_into_tensor", rank_, size()};
  v.tensors(std::array{in, out}, "tensors");
  v.numel(out.numel(), in.numel() * size(), "output_tensor");
  tensor_list ts{in};
  return track(backend_for("allgather_into_tensor", ts).allgather_into_tensor(out, in, o),
               "allgather_into_tensor", ts, -1);
}

work process_group::allgather_coalesced(std::vector<tensor_list> outs, tensor_list ins,
                                        const allgather_options& o) {
  check_member("allgather_coalesced");
  validator v{"allgather_coalesced", rank_, size()};
  v.tensors(ins, "input_tensors");
  v.length(outs.size(), static_cast<std::size_t>(size()),
           "output_tensor_lists (one list per rank)");
  for (auto& per_rank : outs) {
    v.length(per_rank.size(), ins.size(), "output_tensor_lists[r]");
    v.tensors(per_rank, "output_tensor_lists[r]");
    v.same_dtype(per_rank, ins[0]);
    for (std::size_t i = 0; i < ins.size(); ++i)
      v.numel(per_rank[i].numel(), ins[i].numel(), "an output tensor");
  }
  return track(backend_for("allgather_coalesced", ins).allgather_coalesced(outs, ins, o),
               "allgather_coalesced", ins, -1);
}

work process_group::allgather_into_tensor_coalesced(tensor_list outs, tensor_list ins,
                                                    const allgather_options& o) {
  check_member("allgather_into_tensor_coalesced");
  validator v{"allgather_into_tensor_coalesced", rank_, size()};
  v.tensors(ins, "inputs");
  v.length(outs.size(), ins.size(), "outputs");
  v.tensors(outs, "outputs");
  v.same_dtype(outs, ins[0]);
  for (std::size_t i = 0; i < ins.size(); ++i)
    v.numel(outs[i].numel(), ins[i].numel() * size(), "outputs[i]");
  return track(backend_for("allgather_into_tensor_coalesced", ins)
                   .allgather_into_tensor_coalesced(outs, ins, o),
               "allgather_into_tensor_coalesced", ins, -1);
}

work process_group::gather(std::vector<tensor_list> outs, tensor_list ins,
                           const gather_options& o) {
  check_member("gather");
  validator v{"gather", rank_, size()};
  v.rank_arg(o.root_rank, "root_rank");
  v.tensors(ins, "input_tensors");
  v.length(ins.size(), 1, "input_tensors");
  if (rank_ == o.root_rank) {
    v.length(outs.size(), 1, "output_tensors on the root");
    v.length(outs[0].size(), static_cast<std::size_t>(size()), "output_tensors[0] on the root");
    v.tensors(outs[0], "output_tensors[0]");
    v.same_dtype(outs[0], ins[0]);
    for (auto& t : outs[0]) v.numel(t.numel(), ins[0].numel(), "an output tensor");
  } else if (!outs.empty()) {
    v.fail("output_tensors must be empty on non-root rank " + std::to_string(rank_) + " (root is " +
           std::to_string(o.root_rank) + ")");
  }
  return track(backend_for("gather", ins).gather(outs, ins, o), "gather", ins, -1);
}

work process_group::gather(tensor_list outs, tensor in, const gather_options& o) {
  std::vector<tensor_list> lists;
  if (!outs.empty()) lists.push_back(std::move(outs));
  return gather(std::move(lists), tensor_list{std::move(in)}, o);
}

work process_group::scatter(tensor_list outs, std::vector<tensor_list> ins,
                            const scatter_options& o) {
  check_member("scatter");
  validator v{"scatter", rank_, size()};
  v.rank_arg(o.root_rank, "root_rank");
  v.tensors(outs, "output_tensors");
  v.length(outs.size(), 1, "output_tensors");
  if (rank_ == o.root_rank) {
    v.length(ins.size(), 1, "input_tensors on the root");
    v.length(ins[0].size(), static_cast<std::size_t>(size()), "input_tensors[0] on the root");
    v.tensors(ins[0], "input_tensors[0]");
    v.same_dtype(ins[0], outs[0]);
    for (auto& t : ins[0]) v.numel(t.numel(), outs[0].numel(), "an input tensor");
  } else if (!ins.empty()) {
    v.fail("input_tensors must be empty on non-root rank " + std::to_string(rank_) + " (root is " +
           std::to_string(o.root_rank) + ")");
  }
  return track(backend_for("scatter", outs).scatter(outs, ins, o), "scatter", outs, -1);
}

work process_group::scatter(tensor out, tensor_list ins, const scatter_options& o) {
  std::vector<tensor_list> lists;
  if (!ins.empty()) lists.push_back(std::move(ins));
  return scatter(tensor_list{std::move(out)}, std::move(lists), o);
}

work process_group::reduce_scatter(tensor_list outs, std::vector<tensor_list> ins,
                                   const reduce_scatter_options& o) {
  check_member("reduce_scatter");
  validator v{"reduce_scatter", rank_, size()};
  v.tensors(outs, "output_tensors");
  v.length(outs.size(), 1, "output_tensors");
  v.length(ins.size(), 1, "input_tensors");
  v.length(ins[0].size(), static_cast<std::size_t>(size()), "input_tensors[0]");
  v.tensors(ins[0], "input_tensors[0]");
  v.same_dtype(ins[0], outs[0]);
  for (auto& t : ins[0]) v.numel(t.numel(), outs[0].numel(), "an input tensor");
  check_reduce_supported("reduce_scatter", o.op, outs[0].scalar_type());
  return track(backend_for("reduce_scatter", outs).reduce_scatter(outs, ins, o), "reduce_scatter",
               outs, -1);
}

work process_group::reduce_scatter(tensor out, tensor_list ins, const reduce_scatter_options& o) {
  return reduce_scatter(tensor_list{std::move(out)}, std::vector<tensor_list>{std::move(ins)}, o);
}

work process_group::reduce_scatter_tensor(tensor out, tensor in, const reduce_scatter_options& o) {
  check_member("reduce_scatter_tensor");
  validator v{"reduce_scatter_tensor", rank_, size()};
  v.tensors(std::array{in, out}, "tensors");
  v.numel(in.numel(), out.numel() * size(), "input_tensor");
  check_reduce_supported("reduce_scatter_tensor", o.op, out.scalar_type());
  tensor_list ts{out};
  return track(backend_for("reduce_scatter_tensor", ts).reduce_scatter_tensor(out, in, o),
               "reduce_scatter_tensor", ts, -1);
}

work process_group::reduce_scatter_tensor_coalesced(tensor_list outs, tensor_list ins,
                                                    const reduce_scatter_options& o) {
  check_member("reduce_scatter_tensor_coalesced");
  validator v{"reduce_scatter_tensor_coalesced", rank_, size()};
  v.tensors(ins, "inputs");
  v.length(outs.size(), ins.size(), "outputs");
  v.tensors(outs, "outputs");
  v.same_dtype(outs, ins[0]);
  for (std::size_t i = 0; i < ins.size(); ++i)
    v.numel(ins[i].numel(), outs[i].numel() * size(), "inputs[i]");
  check_reduce_supported("reduce_scatter_tensor_coalesced", o.op, ins[0].scalar_type());
  return track(backend_for("reduce_scatter_tensor_coalesced", ins)
                   .reduce_scatter_tensor_coalesced(outs, ins, o),
               "reduce_scatter_tensor_coalesced", ins, -1);
}

work process_group::alltoall_single(tensor out, tensor in, std::vector<std::int64_t> out_splits,
                                    std::vector<std::int64_t> in_splits,
                                    const alltoall_options& o) {
  check_member("alltoall_single");
  validator v{"alltoall_single", rank_, size()};
  v.tensors(std::array{in, out}, "tensors");
  auto rows = [](const tensor& t) { return t.dim() == 0 ? std::int64_t{1} : t.shape()[0]; };
  auto row_size = [&](const tensor& t) { return rows(t) == 0 ? 0 : t.numel() / rows(t); };
  if (in.numel() > 0 && out.numel() > 0 && row_size(in) != row_size(out))
    v.fail("input rows have " + std::to_string(row_size(in)) + " elements but output rows have " +
           std::to_string(row_size(out)));
  auto check_splits = [&](const std::vector<std::int64_t>& s, const tensor& t, const char* what) {
    if (s.empty()) {
      if (rows(t) % size() != 0)
        v.fail(std::string(what) + " is empty, so dim 0 of size " + std::to_string(rows(t)) +
               " must divide evenly by the group size " + std::to_string(size()));
      return;
    }
    auto sum = v.counts(s, what);
    if (sum != rows(t))
      v.fail(std::string(what) + " sum to " + std::to_string(sum) + " but dim 0 has " +
             std::to_string(rows(t)) + " rows");
  };
  check_splits(in_splits, in, "input_split_sizes");
  check_splits(out_splits, out, "output_split_sizes");
  tensor_list ts{in};
  return track(
      backend_for("alltoall_single", ts).alltoall_single(out, in, out_splits, in_splits, o),
      "alltoall_single", ts, -1);
}

work process_group::alltoall(tensor_list outs, tensor_list ins, const alltoall_options& o) {
  check_member("alltoall");
  validator v{"alltoall", rank_, size()};
  v.length(ins.size(), static_cast<std::size_t>(size()), "input_tensors");
  v.length(outs.size(), static_cast<std::size_t>(size()), "output_tensors");
  v.tensors(ins, "input_tensors");
  v.tensors(outs, "output_tensors");
  v.same_dtype(outs, ins[0]);
  return track(backend_for("alltoall", ins).alltoall(outs, ins, o), "alltoall", ins, -1);
}

work process_group::barrier(const barrier_options& o) {
  check_member("barrier");
  return track(tensorless_backend().barrier(o), "barrier", {}, -1);
}

work process_group::monitored_barrier(const monitored_barrier_options& o) {
  check_member("monitored_barrier");
  return track(tensorless_backend().monitored_barrier(o), "monitored_barrier", {}, -1);
}

// -- variable-size forms -----------------------------------------------------------

work process_group::allgatherv(tensor out, tensor in, std::vector<std::int64_t> counts,
                               const allgather_options& o) {
  check_member("allgatherv");
  validator v{"allgatherv", rank_, size()};
  v.tensors(std::array{in, out}, "tensors");
  v.all_blocks(out, v.blocks(counts, in, "input"), "output");
  tensor_list ts{in};
  return track(backend_for("allgatherv", ts).allgatherv(out, in, counts, o), "allgatherv", ts, -1);
}

work process_group::gatherv(tensor out, tensor in, std::vector<std::int64_t> counts,
                            const gather_options& o) {
  check_member("gatherv");
  validator v{"gatherv", rank_, size()};
  v.rank_arg(o.root_rank, "root_rank");
  v.tensor1(in, "input");
  const auto sum = v.blocks(counts, in, "input");
  if (rank_ == o.root_rank) {
    v.tensors(std::array{in, out}, "tensors");
    v.all_blocks(out, sum, "output");
  }
  tensor_list ts{in};
  return track(backend_for("gatherv", ts).gatherv(out, in, counts, o), "gatherv", ts, -1);
}

work process_group::scatterv(tensor out, tensor in, std::vector<std::int64_t> counts,
                             const scatter_options& o) {
  check_member("scatterv");
  validator v{"scatterv", rank_, size()};
  v.rank_arg(o.root_rank, "root_rank");
  v.tensor1(out, "output");
  const auto sum = v.blocks(counts, out, "output");
  if (rank_ == o.root_rank) {
    v.tensors(std::array{in, out}, "tensors");
    v.all_blocks(in, sum, "input");
  }
  tensor_list ts{out};
  return track(backend_for("scatterv", ts).scatterv(out, in, counts, o), "scatterv", ts, -1);
}

work process_group::reduce_scatterv(tensor out, tensor in, std::vector<std::int64_t> counts,
                                    const reduce_scatter_options& o) {
  check_member("reduce_scatterv");
  validator v{"reduce_scatterv", rank_, size()};
  v.tensors(std::array{in, out}, "tensors");
  v.all_blocks(in, v.blocks(counts, out, "output"), "input");
  check_reduce_supported("reduce_scatterv", o.op, in.scalar_type());
  tensor_list ts{in};
  return track(backend_for("reduce_scatterv", ts).reduce_scatterv(out, in, counts, o),
               "reduce_scatterv", ts, -1);
}

// -- point to point ------------------------------------------------------------------

namespace {

void check_peer(const validator& v, int peer, int rank, const char* what) {
  v.rank_arg(peer, what);
  if (peer == rank)
    v.fail(std::string(what) + " " + std::to_string(peer) +
           " is this rank; sending to or receiving from self is not supported");
}

void check_p2p_tensors(const validator& v, std::span<const tensor> ts, int tag) {
  v.tensors(ts, "tensors");
  v.length(ts.size(), 1, "tensors");
  if (tag < 0) v.fail("tag " + std::to_string(tag) + " is negative");
}

}  // namespace

work process_group::send(tensor_list ts, int dst, const p2p_options& o) {
  check_member("send");
  validator v{"send", rank_, size()};
  check_p2p_tensors(v, ts, o.tag);
  check_peer(v, dst, rank_, "dst_rank");
  return track(backend_for("send", ts).send(ts, dst, o), "send", ts, dst);
}

work process_group::recv(tensor_list ts, int src, const p2p_options& o) {
  check_member("recv");
  validator v{"recv", rank_, size()};
  check_p2p_tensors(v, ts, o.tag);
  check_peer(v, src, rank_, "src_rank");
  return track(backend_for("recv", ts).recv(ts, src, o), "recv", ts, src);
}

work process_group::recv_any_source(tensor_list ts, const p2p_options& o) {
  check_member("recv_any_source");
  validator v{"recv_any_source", rank_, size()};
  check_p2p_tensors(v, ts, o.tag);
  return track(backend_for("recv_any_source", ts).recv_any_source(ts, o), "recv_any_source", ts,
               -1);
}

work process_group::batch_isend_irecv(std::vector<p2p_op> ops) {
  check_member("batch_isend_irecv");
  validator v{"batch_isend_irecv", rank_, size()};
  if (ops.empty()) v.fail("the list of operations is empty");
  // Validate every op first, so that a bad one issues nothing.
  for (auto& op : ops) {
    check_p2p_tensors(v, {&op.buffer, 1}, op.tag);
    check_peer(v, op.peer, rank_, op.kind == p2p_op::isend ? "isend peer" : "irecv peer");
  }
  // Every buffer on one device: that device's backend issues the batch
  // (NCCL groups it); otherwise each op goes to its own device's backend.
  tensor_list buffers;
  buffers.reserve(ops.size());
  for (auto& op : ops) buffers.push_back(op.buffer);
  const auto d = ops.front().buffer.get_device().type;
  const bool one_device = std::all_of(
      ops.begin(), ops.end(), [d](const p2p_op& op) { return op.buffer.get_device().type == d; });
  if (one_device)
    return track(backend_for("batch_isend_irecv", buffers).batch_isend_irecv(ops),
                 "batch_isend_irecv", buffers, -1);
  std::vector<work> parts;
  const bool outer = coalescing_;
  coalescing_ = false;  // the parts are tracked as one work below
  for (auto& op : ops)
    parts.push_back(op.kind == p2p_op::isend ? send(op.buffer, op.peer, op.tag)
                                             : recv(op.buffer, op.peer, op.tag));
  coalescing_ = outer;
  return track(work::when_all("batch_isend_irecv", name_, std::move(parts)), "batch_isend_irecv",
               {}, -1);
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
