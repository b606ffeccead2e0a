#pragma once
/// troupe_torch::ProcessGroupTroupe — a c10d::ProcessGroup (PyTorch 1.13's
/// interface) that runs every call on a troupe process group: what
/// torch.distributed calls the backend "troupe".
///
/// Each call converts its tensors without a copy (troupe_torch/tensor.hpp),
/// lets troupe validate them (errors name the call and the value) and
/// returns a c10d::Work over troupe's work: wait() drives the operation,
/// isCompleted/isSuccess/exception ask troupe, and getFuture() is a
/// c10::ivalue::Future completed from troupe's work::on_complete, with the
/// output tensors as gloo returns them (List[Tensor], or List[List[Tensor]]
/// for calls with several output lists). Future callbacks never run on
/// troupe's own threads: a small pool of the bridge's runs them, so a
/// callback may block on another future (as PowerSGD's Python hook does).
///
/// From Python: `import troupe_torch` registers the backend, then
/// `torch.distributed.init_process_group("troupe")`. One troupe world per
/// process serves the default group and every group made by new_group.
///
/// From C++ (LibTorch): make one over a troupe group, or join a world of its
/// own through a c10d store.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "troupe/process_group.hpp"
#include "troupe/world.hpp"

namespace troupe_torch {

class ProcessGroupTroupe final : public c10d::ProcessGroup {
 public:
  /// Runs every call on `group`; `keep_alive` (the group's world, when the
  /// caller does not keep it otherwise) lives as long as this process group.
  explicit ProcessGroupTroupe(std::shared_ptr<troupe::process_group> group,
                              std::shared_ptr<troupe::world> keep_alive = nullptr);
  /// Joins a world of its own through `store` (collective: every rank of
  /// the world makes one) and runs on its default group.
  ProcessGroupTroupe(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout = kProcessGroupDefaultTimeout);
  ~ProcessGroupTroupe() override;

  /// torch.distributed's entry (Backend.register_backend(..., extended_api=True)):
  /// the default group (no global ranks) makes this process's troupe world;
  /// later groups are groups of that world (its new_group with the members
  /// only). A group made while the default group is not troupe's joins a
  /// world of its own over the group's store.
  static c10::intrusive_ptr<ProcessGroupTroupe> create(const c10d::DistributedBackendOptions& opts);

  /// The troupe group every call runs on.
  troupe::process_group& group() const noexcept { return *group_; }
  /// The world of the group, when this process group keeps it.
  const std::shared_ptr<troupe::world>& world() const noexcept { return world_; }

  const std::string getBackendName() const override { return "troupe"; }

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
      std::vector<int64_t>& input_split_sizes,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks = false) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  // (The default arguments repeat c10d's, for calls through this class.)
  /// troupe's groups number their calls from 0 on every rank: nothing to agree on.
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

 private:
  std::shared_ptr<troupe::world> world_;
  std::shared_ptr<troupe::process_group> group_;
};

/// Waits until the bridge's completion threads have nothing queued or
/// running, at most `timeout`; returns whether they are idle. The Python
/// package calls it at exit, so that no tensor with a Python object is
/// released on those threads while the interpreter finalizes.
bool wait_for_completions(std::chrono::milliseconds timeout);

/// The c10d::Work over a troupe work, for calls made on troupe directly
/// (e.g. a comm hook written against troupe returning to torch code).
/// `outputs` are the tensors the future completes with. With a
/// `profiling_title` ("troupe:all_reduce"), a profiler that records sees the
/// call as an asynchronous event of that name with the shapes of `inputs`,
/// from the call until its work completes (as c10d::Work's profilingTitle).
c10::intrusive_ptr<c10d::Work> make_work(troupe::work w, c10d::OpType type,
                                         std::vector<std::vector<at::Tensor>> outputs, int rank,
                                         const char* profiling_title = nullptr,
                                         const std::vector<at::Tensor>& inputs = {});

}  // namespace troupe_torch
