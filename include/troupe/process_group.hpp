#pragma once
/// troupe::process_group — a group of ranks and the c10d calls on it.
///
/// Every call validates its arguments once (errors name the call and the
/// offending value), then dispatches by the tensors' device to the backend
/// registered for it, and returns a work. `pg.allreduce(t).wait()` is the
/// blocking form. Tensors are handles: outputs are written into the memory the
/// caller passed, which must stay untouched until the work completes.
///
/// A process_group handed to a rank that is not a member (new_group without
/// local synchronization) refuses every call with errc::group: running a
/// collective on a group you are not in is almost always a bug, so troupe
/// reports it instead of silently doing nothing as torch.distributed does.

#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "troupe/backend.hpp"
#include "troupe/flight_recorder.hpp"
#include "troupe/options.hpp"
#include "troupe/tensor.hpp"
#include "troupe/work.hpp"

namespace troupe {

class world;

/// The timeout of a world and of its groups when none is given (c10d's
/// kProcessGroupDefaultTimeout, torch.distributed's default_pg_timeout).
inline constexpr std::chrono::milliseconds default_pg_timeout = std::chrono::minutes(30);

/// What an on-completion hook learns of a finished call (c10d's WorkInfo).
struct work_info {
  std::string op;                                      ///< "allreduce", "send", ...
  std::uint64_t seq = 0;                               ///< the group's sequence number (0: none)
  std::chrono::system_clock::time_point time_started;  ///< when the call was issued
  std::chrono::system_clock::time_point time_finished;
  std::chrono::nanoseconds active_duration{};  ///< issue to completion (a steady clock's)
  bool success = true;                         ///< false: the work failed
};

class process_group {
 public:
  /// Internal: made by world (or by tests through world).
  process_group(std::string name, std::string description, int rank, std::vector<int> global_ranks,
                std::map<device_type, std::shared_ptr<backend>> backends,
                std::map<device_type, std::string> unavailable = {},
                std::chrono::milliseconds timeout = default_pg_timeout);
  ~process_group();
  process_group(const process_group&) = delete;
  process_group& operator=(const process_group&) = delete;

  /// This rank's rank in the group (-1 when not a member).
  int rank() const noexcept { return rank_; }
  /// Number of ranks in the group.
  int size() const noexcept { return static_cast<int>(global_ranks_.size()); }
  bool is_member() const noexcept { return rank_ >= 0; }
  /// Unique name ("default", "group1", ...), or what set_name() gave it.
  const std::string& name() const noexcept { return name_; }
  /// User-given description (defaults to the name).
  const std::string& description() const noexcept { return description_; }
  /// Renames the group (c10d's setGroupName): what name() returns from now
  /// on. The world still finds the group; the engine's messages keep the
  /// name the group was created with.
  void set_name(std::string name);
  /// c10d's setGroupDesc.
  void set_description(std::string description);
  /// World rank of each group rank.
  const std::vector<int>& global_ranks() const noexcept { return global_ranks_; }
  /// The timeout of the group's calls when their options give none (c10d's
  /// Options::timeout): new_group's, else the world's, else default_pg_timeout.
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// An id of this group object (c10d's getID): the same for the group's
  /// whole life, and no other group alive in this process has it (each
  /// rank of a process holds a group object of its own).
  std::int64_t get_id() const noexcept;
  /// An id of the backend of type `t` (c10d's getBackendID), with get_id()'s
  /// guarantees for the backend object: devices served by one backend (the
  /// actor backend's cpu and cuda) share it. errc::backend as get_backend(t).
  std::int64_t get_backend_id(backend_type t) const;
  /// An id of the backend that runs device type `d`; errc::backend as get_backend(d).
  std::int64_t get_backend_id(device_type d) const;
  /// The device types that have a backend in this group (c10d's
  /// getDeviceTypes), in device_type order; a device whose backend is not
  /// registered in this build is not among them. Empty for a non-member.
  std::vector<device_type> get_device_types() const;
  /// The backend that runs calls on `d` (throws errc::backend when none).
  backend& get_backend(device_type d) const;
  /// The backend of type `t` (c10d's getBackend(BackendType)); errc::backend
  /// "Could not find backend type T." when the group has none.
  backend& get_backend(backend_type t) const;
  /// The type of the group's default backend: the cpu's, else the only one.
  backend_type get_backend_type() const;
  /// The group's default backend (c10d's getDefaultBackend): the one that
  /// runs calls without tensors (barrier): the cpu's, else the only one;
  /// errc::backend when the group has none.
  backend& get_default_backend() const;
  /// Installs `b` as the backend of device `d` and of type `t` (c10d's
  /// setBackend), replacing what ran there.
  void set_backend(device_type d, backend_type t, std::shared_ptr<backend> b);
  /// The backends' name (c10d's getBackendName): "actor", or
  /// "cpu:actor,cuda:nccl" when devices differ.
  std::string backend_name() const;
  /// The device the group is bound to, if any (c10d's getBoundDeviceId).
  std::optional<device> bound_device() const { return bound_device_; }
  /// Binds the group to `d` (a cuda device needs an index >= 0), or unbinds it.
  void set_bound_device(std::optional<device> d);
  /// Number of collectives issued on this group so far (equal on all members
  /// once they issued the same calls).
  std::uint64_t sequence_number() const;
  /// c10d's setSequenceNumberForGroup: troupe's numbers start at 0 on every
  /// member, so the actor and nccl backends have nothing to agree on; other
  /// backends are refused with errc::backend "ProcessGroup NAME does not yet
  /// support sequence numbers." (c10d's text).
  void set_sequence_number_for_group();
  /// c10d's getSequenceNumberForGroup: sequence_number(), for the backends
  /// that keep one (actor, nccl); others are refused as above.
  std::uint64_t get_sequence_number_for_group() const;

  // -- collectives -------------------------------------------------------------
  // broadcast, allreduce and reduce take a list (c10d's form) or one tensor
  // (the common case, issued without a list).
  work broadcast(tensor_list tensors, const broadcast_options& opts = {});
  work broadcast(tensor t, const broadcast_options& opts);
  work broadcast(tensor t, int root = 0) { return broadcast(std::move(t), {.root_rank = root}); }
  work allreduce(tensor_list tensors, const allreduce_options& opts = {});
  work allreduce(tensor t, const allreduce_options& opts);
  work allreduce(tensor t, reduce_op op = reduce_op::SUM) {
    return allreduce(std::move(t), allreduce_options{.op = op});
  }
  work allreduce_coalesced(tensor_list tensors, const allreduce_coalesced_options& opts = {});
  /// The same with allreduce_options (`{.op = reduce_op::MAX}`); a template
  /// so that `{}` still means the form above.
  template <class O = allreduce_options>
    requires std::same_as<O, allreduce_options>
  work allreduce_coalesced(tensor_list tensors, const O& opts) {
    return allreduce_coalesced(std::move(tensors), allreduce_coalesced_options{opts});
  }
  work reduce(tensor_list tensors, const reduce_options& opts = {});
  work reduce(tensor t, const reduce_options& opts);
  work reduce(tensor t, int root, reduce_op op = reduce_op::SUM) {
    return reduce(std::move(t), {.op = op, .root_rank = root});
  }
  /// outputs[i][r] receives rank r's inputs[i] (c10d allgather; normally one input).
  work allgather(std::vector<tensor_list> outputs, tensor_list inputs,
                 const allgather_options& opts = {});
  /// outputs[r] receives rank r's input.
  work allgather(tensor_list outputs, tensor input, const allgather_options& opts = {});
  /// output (size × input numel) receives every rank's input, in rank order.
  work allgather_into_tensor(tensor output, tensor input, const allgather_options& opts = {});
  work allgather_coalesced(std::vector<tensor_list> outputs, tensor_list inputs,
                           const allgather_options& opts = {});
  work allgather_into_tensor_coalesced(tensor_list outputs, tensor_list inputs,
                                       const allgather_options& opts = {});
  /// On the root, outputs[0][r] receives rank r's inputs[0]; elsewhere outputs is empty.
  work gather(std::vector<tensor_list> outputs, tensor_list inputs,
              const gather_options& opts = {});
  work gather(tensor_list outputs, tensor input, const gather_options& opts = {});
  /// Rank r's outputs[0] receives the root's inputs[0][r]; elsewhere inputs is empty.
  work scatter(tensor_list outputs, std::vector<tensor_list> inputs,
               const scatter_options& opts = {});
  work scatter(tensor output, tensor_list inputs, const scatter_options& opts = {});
  /// outputs[0] receives the reduction over ranks of inputs[0][rank].
  work reduce_scatter(tensor_list outputs, std::vector<tensor_list> inputs,
                      const reduce_scatter_options& opts = {});
  work reduce_scatter(tensor output, tensor_list inputs, const reduce_scatter_options& opts = {});
  /// input has size × output numel elements; output receives this rank's reduced block.
  work reduce_scatter_tensor(tensor output, tensor input, const reduce_scatter_options& opts = {});
  work reduce_scatter_tensor_coalesced(tensor_list outputs, tensor_list inputs,
                                       const reduce_scatter_options& opts = {});
  /// Splits input along dim 0 by input_split_sizes (rows sent to each rank) and
  /// receives output_split_sizes rows from each rank; empty splits mean equal parts.
  work alltoall_single(tensor output, tensor input,
                       std::vector<std::int64_t> output_split_sizes = {},
                       std::vector<std::int64_t> input_split_sizes = {},
                       const alltoall_options& opts = {});
  /// outputs[r] receives rank r's inputs[rank()].
  work alltoall(tensor_list outputs, tensor_list inputs, const alltoall_options& opts = {});
  /// Completes once every rank of the group called it. `opts.device_ids`
  /// are checked here (each a CUDA device this process sees, once; else
  /// errc::invalid_argument and nothing is issued) and handed to the backend.
  work barrier(const barrier_options& opts = {});
  /// A barrier that fails with the list of every rank that did not arrive in time.
  work monitored_barrier(const monitored_barrier_options& opts = {});

  // -- variable-size forms (counts in elements, one per group rank) ------------
  /// output (sum of counts) receives rank r's input (counts[r] elements) at offset sum(counts[<r]).
  work allgatherv(tensor output, tensor input, std::vector<std::int64_t> counts,
                  const allgather_options& opts = {});
  /// As allgatherv, but only the root receives (output ignored elsewhere).
  work gatherv(tensor output, tensor input, std::vector<std::int64_t> counts,
               const gather_options& opts = {});
  /// Rank r's output receives counts[r] elements of the root's input at offset sum(counts[<r]).
  work scatterv(tensor output, tensor input, std::vector<std::int64_t> counts,
                const scatter_options& opts = {});
  /// input (sum of counts) on every rank; rank r's output receives the reduced block r.
  work reduce_scatterv(tensor output, tensor input, std::vector<std::int64_t> counts,
                       const reduce_scatter_options& opts = {});

  // -- point to point -----------------------------------------------------------
  /// The p2p_options forms take a tag and a timeout (default: the group's).
  /// A list (c10d's form, of exactly one tensor) or the tensor itself (issued without a list).
  work send(tensor_list tensors, int dst_rank, const p2p_options& opts);
  work recv(tensor_list tensors, int src_rank, const p2p_options& opts);
  work recv_any_source(tensor_list tensors, const p2p_options& opts);
  work send(tensor t, int dst_rank, const p2p_options& opts);
  work recv(tensor t, int src_rank, const p2p_options& opts);
  work recv_any_source(tensor t, const p2p_options& opts);
  work send(tensor_list tensors, int dst_rank, int tag = 0) {
    return send(std::move(tensors), dst_rank, p2p_options{.tag = tag});
  }
  work send(tensor t, int dst_rank, int tag = 0) {
    return send(std::move(t), dst_rank, p2p_options{.tag = tag});
  }
  work recv(tensor_list tensors, int src_rank, int tag = 0) {
    return recv(std::move(tensors), src_rank, p2p_options{.tag = tag});
  }
  work recv(tensor t, int src_rank, int tag = 0) {
    return recv(std::move(t), src_rank, p2p_options{.tag = tag});
  }
  /// Receives from whichever rank sends first with `tag`; work.source_rank() tells who.
  work recv_any_source(tensor_list tensors, int tag = 0) {
    return recv_any_source(std::move(tensors), p2p_options{.tag = tag});
  }
  work recv_any_source(tensor t, int tag = 0) {
    return recv_any_source(std::move(t), p2p_options{.tag = tag});
  }
  /// Issues every send and recv; the work completes when all of them did.
  work batch_isend_irecv(std::vector<p2p_op> ops);

  // -- coalescing ---------------------------------------------------------------
  /// Calls until end_coalescing() are issued as usual and collected.
  void start_coalescing();
  /// One work that completes when every call since start_coalescing() did.
  work end_coalescing();

  /// Fails every pending operation with `reason` and refuses new ones.
  void abort(const std::string& reason);

  // -- hooks (c10d's registerOnCompletionHook, waitForPendingWorks) --------------
  /// Runs `hook` once for every call issued on this group from now on, when
  /// its work completes or fails, on the thread that completes it (keep it
  /// short; what it throws is reported and dropped). One hook per group, as
  /// c10d's: a second registration throws errc::invalid_argument. A work with
  /// a hook has a continuation, so the inline engine's progress thread
  /// drives it even when nobody waits.
  void register_on_completion_hook(std::function<void(const work_info&)> hook);
  /// Whether an on-completion hook is registered (c10d's hasHooks): false
  /// until register_on_completion_hook succeeds, true from then on.
  bool has_hooks() const noexcept;
  /// Records every call of this group from now on with its issue and end
  /// times (c10d's enableCollectivesTiming): the flight record keeps them
  /// even where TROUPE_FLIGHT_RECORDER=0 turned it off.
  void enable_collectives_timing();
  /// This rank's record of the group's last calls, oldest first
  /// (troupe/flight_recorder.hpp); empty when recording is off.
  std::vector<flight_entry> flight_record() const;
  /// Waits until every call issued on this group so far has completed;
  /// rethrows the first failure once all ended.
  void wait_for_pending_works();

 private:
  friend class world;
  /// Aborts pending work and drops the backends (the world is going away).
  void release(const std::string& reason);
  void check_member(const char* op) const;
  backend& backend_for(const char* op, std::span<const tensor> tensors) const;
  /// Runs calls without tensors (barrier, sequence_number): the CPU's backend,
  /// else the only one the group has.
  backend& tensorless_backend() const;
  /// barrier's device_ids: each a CUDA device this process sees, once.
  void check_device_ids(const std::vector<std::int64_t>& ids) const;
  /// What the flight record says of a call's tensors: their elements and
  /// bytes in all, the first one's dtype, how many.
  struct call_size {
    std::int64_t numel = 0;
    std::uint64_t bytes = 0;
    dtype type = dtype::float32;
    int tensors = 0;
    void add(const tensor& t);
  };
  /// Remembers an issued call (wait_for_pending_works, the hook, the flight record).
  work track(work w, const char* op, std::span<const tensor> ts, int peer);
  work track_sized(work w, const char* op, const call_size& size, int peer);

  std::string name_;
  std::string description_;
  int rank_;
  std::vector<int> global_ranks_;
  std::chrono::milliseconds timeout_;
  /// Refuses backends without sequence numbers, naming `op`.
  void check_sequence_numbers(const char* op) const;

  std::map<device_type, std::shared_ptr<backend>> backends_;
  std::map<backend_type, std::shared_ptr<backend>> by_type_;
  std::map<device_type, std::string> unavailable_;  // device -> backend name not registered
  std::optional<device> bound_device_;
  std::string released_;  // why the group is gone (empty: alive)
  bool coalescing_ = false;
  std::vector<work> coalesced_;
  struct issued_state;  // the works issued and the completion hook (shared by copies)
  std::shared_ptr<issued_state> issued_;
};

}  // namespace troupe
