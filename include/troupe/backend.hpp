#pragma once
/// troupe::backend — what actually runs a group's calls on one kind of device
/// (c10d's Backend), plus the registry of backends by name and the parsing of
/// backend strings ("actor", "cpu:actor,cuda:nccl").
///
/// A process_group validates every call once, then hands it to the backend
/// registered for the tensors' device. Backends receive validated arguments.
/// A user-written backend derives from `backend`, overrides what it supports
/// and is registered with register_backend(); every call it does not override
/// fails with a clear errc::backend error.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/debug.hpp"
#include "troupe/device.hpp"
#include "troupe/options.hpp"
#include "troupe/store.hpp"
#include "troupe/tensor.hpp"
#include "troupe/work.hpp"

namespace troupe {

/// Which kind of backend runs a group's calls on a device (c10d's
/// ProcessGroup::BackendType): troupe's own "actor" and "nccl", or a
/// user-written one.
enum class backend_type : std::uint8_t { undefined, actor, nccl, custom };

/// "undefined", "actor", "nccl", "custom".
const char* to_string(backend_type t) noexcept;
/// The type of the backend named `name` (any letter case): actor, nccl,
/// custom for any other name, undefined for "".
backend_type backend_type_of(const std::string& name);

/// One point-to-point operation of batch_isend_irecv.
struct p2p_op {
  enum kind_t { isend, irecv } kind;
  tensor buffer;
  int peer;  ///< group rank
  int tag = 0;
};

/// What a backend is created with.
struct backend_context {
  std::shared_ptr<troupe::store> store;  ///< a store private to this group
  int rank = 0;                          ///< rank in the group
  int size = 0;                          ///< group size
  std::vector<int> global_ranks;         ///< world rank of each group rank
  std::string group_name;
  std::chrono::milliseconds timeout{};
  troupe::device_type device = device_type::cpu;
  /// TROUPE_DEBUG as read when the world started.
  debug_level debug = debug_level::off;
  void* runtime = nullptr;  ///< internal: the rank's actor runtime (built-in backends)
};

class backend {
 public:
  explicit backend(const backend_context& ctx)
      : rank_(ctx.rank), size_(ctx.size), group_name_(ctx.group_name) {}
  virtual ~backend() = default;
  backend(const backend&) = delete;
  backend& operator=(const backend&) = delete;

  /// The backend's name ("actor", "dummy", ...).
  virtual std::string name() const = 0;
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const std::string& group_name() const noexcept { return group_name_; }

  // The lists and tensors passed by reference are the process group's own
  // copies of the caller's arguments: a backend may move from them (the
  // group reads only the tensors it records, before and after the call:
  // gather's and scatter's root lists are not among them).
  virtual work broadcast(tensor_list& tensors, const broadcast_options& opts);
  virtual work allreduce(tensor_list& tensors, const allreduce_options& opts);
  virtual work allreduce_coalesced(tensor_list& tensors, const allreduce_coalesced_options& opts);
  virtual work reduce(tensor_list& tensors, const reduce_options& opts);
  virtual work allgather(std::vector<tensor_list>& outputs, tensor_list& inputs,
                         const allgather_options& opts);
  virtual work allgather_into_tensor(tensor& output, tensor& input, const allgather_options& opts);
  virtual work allgather_coalesced(std::vector<tensor_list>& outputs, tensor_list& inputs,
                                   const allgather_options& opts);
  virtual work allgather_into_tensor_coalesced(tensor_list& outputs, tensor_list& inputs,
                                               const allgather_options& opts);
  virtual work gather(std::vector<tensor_list>& outputs, tensor_list& inputs,
                      const gather_options& opts);
  virtual work scatter(tensor_list& outputs, std::vector<tensor_list>& inputs,
                       const scatter_options& opts);
  virtual work reduce_scatter(tensor_list& outputs, std::vector<tensor_list>& inputs,
                              const reduce_scatter_options& opts);
  virtual work reduce_scatter_tensor(tensor& output, tensor& input,
                                     const reduce_scatter_options& opts);
  virtual work reduce_scatter_tensor_coalesced(tensor_list& outputs, tensor_list& inputs,
                                               const reduce_scatter_options& opts);
  virtual work alltoall_single(tensor& output, tensor& input,
                               const std::vector<std::int64_t>& output_split_sizes,
                               const std::vector<std::int64_t>& input_split_sizes,
                               const alltoall_options& opts);
  virtual work alltoall(tensor_list& outputs, tensor_list& inputs, const alltoall_options& opts);
  virtual work barrier(const barrier_options& opts);
  virtual work monitored_barrier(const monitored_barrier_options& opts);
  virtual work send(tensor_list& tensors, int dst_rank, const p2p_options& opts);
  virtual work recv(tensor_list& tensors, int src_rank, const p2p_options& opts);
  virtual work recv_any_source(tensor_list& tensors, const p2p_options& opts);
  /// The forms of one tensor (process_group's broadcast(t), allreduce(t),
  /// reduce(t), gather(outputs, t), scatter(t, inputs), send(t), recv(t),
  /// recv_any_source(t)). Each defaults to its list form with a list of `t`
  /// (and, for gather and scatter, a list of the root's list, none
  /// elsewhere); a backend overrides them to issue the call without
  /// building a list.
  virtual work broadcast_one(tensor& t, const broadcast_options& opts);
  virtual work allreduce_one(tensor& t, const allreduce_options& opts);
  virtual work reduce_one(tensor& t, const reduce_options& opts);
  virtual work gather_one(tensor_list& outputs, tensor& input, const gather_options& opts);
  virtual work scatter_one(tensor& output, tensor_list& inputs, const scatter_options& opts);
  virtual work send_one(tensor& t, int dst_rank, const p2p_options& opts);
  virtual work recv_one(tensor& t, int src_rank, const p2p_options& opts);
  virtual work recv_any_source_one(tensor& t, const p2p_options& opts);
  /// Every send and receive of a batch (validated; all on this backend's
  /// device). The default issues them one by one with send() and recv() and
  /// completes when all did; a backend that must group them (NCCL: two ranks
  /// sending to each other at once) overrides it.
  virtual work batch_isend_irecv(std::vector<p2p_op>& ops);
  virtual work allgatherv(tensor& output, tensor& input, const std::vector<std::int64_t>& counts,
                          const allgather_options& opts);
  virtual work gatherv(tensor& output, tensor& input, const std::vector<std::int64_t>& counts,
                       const gather_options& opts);
  virtual work scatterv(tensor& output, tensor& input, const std::vector<std::int64_t>& counts,
                        const scatter_options& opts);
  virtual work reduce_scatterv(tensor& output, tensor& input,
                               const std::vector<std::int64_t>& counts,
                               const reduce_scatter_options& opts);
  /// The group's current sequence number (number of collectives issued so far).
  virtual std::uint64_t sequence_number();
  /// Fails every pending operation with `reason` and refuses new ones.
  virtual void abort(const std::string& reason);

 protected:
  /// Throws errc::backend "backend 'NAME' does not support OP".
  [[noreturn]] void unsupported(const char* op) const;

 private:
  int rank_;
  int size_;
  std::string group_name_;
};

/// Creates a backend for one group on one device type.
using backend_creator = std::function<std::shared_ptr<backend>(const backend_context&)>;

/// Registers `name` for the given device types, by default cpu and cuda (the
/// default registry of the process, as c10d's Backend.register_backend).
/// Names are case-insensitive: they are kept in lower case, and "DUMMY"
/// finds what "dummy" registered. Registering a name twice (in any case), or
/// an empty name, throws errc::invalid_argument.
void register_backend(const std::string& name, backend_creator creator,
                      std::vector<device_type> devices = {device_type::cpu, device_type::cuda});
/// Whether `name` (any case) is registered (built-in: "actor"; "nccl" in CUDA builds).
bool is_backend_available(const std::string& name);
/// Names of the registered backends (lower case).
std::vector<std::string> available_backends();

/// A parsed backend string: which backend runs each device type.
class backend_config {
 public:
  /// Parses "actor" (expands to cpu:actor,cuda:actor), "gloo"-style single names
  /// (expanded to every device the backend registered), or "cpu:actor,cuda:nccl"
  /// (kept as given; its names need not be registered yet), in any letter
  /// case (names come out in lower case, as c10d's BackendConfig). A
  /// trailing comma, a repeated device, an unknown device or an empty part is
  /// errc::invalid_argument naming the string.
  explicit backend_config(const std::string& spec);
  /// (device, backend name) pairs in the order given.
  const std::vector<std::pair<device_type, std::string>>& entries() const noexcept {
    return entries_;
  }
  /// The backend for `d`, or "" when none.
  std::string backend_for(device_type d) const;
  /// "cpu:actor,cuda:actor".
  std::string to_string() const;

 private:
  std::vector<std::pair<device_type, std::string>> entries_;
};

}  // namespace troupe
