// ProcessGroupTroupe: c10d's calls on a troupe group, and the Work and
// Future over troupe's works (see troupe_torch/process_group.hpp).

#include "troupe_torch/process_group.hpp"

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <ATen/record_function.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <random>
#include <utility>

#include "callback_pool.hpp"
#include "sparse_allreduce.hpp"
#include "troupe/error.hpp"
#include "troupe_torch/store.hpp"
#include "troupe_torch/tensor.hpp"

namespace troupe_torch {
namespace {

using tensor_lists = std::vector<std::vector<at::Tensor>>;

[[noreturn]] void invalid(const std::string& what) {
  throw troupe::error(troupe::errc::invalid_argument, what);
}

/// c10d's "unset" timeout (-1 ms): the group's; zero: expired at once (as
/// c10d, e.g. a monitored barrier that reports who has not arrived yet).
troupe::timeout_t to_timeout(std::chrono::milliseconds t) {
  if (t.count() < 0) return troupe::use_group_timeout;
  return t.count() == 0 ? troupe::timeout_expired : t;
}

int to_int(std::int64_t v, const char* op, const char* what) {
  if (v < INT32_MIN || v > INT32_MAX)
    invalid(std::string(op) + ": " + what + " " + std::to_string(v) + " is out of range");
  return static_cast<int>(v);
}

troupe::reduce_op to_reduce_op(const c10d::ReduceOp& op, const char* name) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return troupe::reduce_op::SUM;
    case c10d::ReduceOp::AVG:
      return troupe::reduce_op::AVG;
    case c10d::ReduceOp::PRODUCT:
      return troupe::reduce_op::PRODUCT;
    case c10d::ReduceOp::MIN:
      return troupe::reduce_op::MIN;
    case c10d::ReduceOp::MAX:
      return troupe::reduce_op::MAX;
    case c10d::ReduceOp::BAND:
      return troupe::reduce_op::BAND;
    case c10d::ReduceOp::BOR:
      return troupe::reduce_op::BOR;
    case c10d::ReduceOp::BXOR:
      return troupe::reduce_op::BXOR;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      if (!s) invalid(std::string(name) + ": PREMUL_SUM without its factor");
      if (s->tensor_factors.empty()) return troupe::reduce_op::premul_sum(s->double_factor);
      if (s->tensor_factors.size() != 1)
        invalid(std::string(name) + ": PREMUL_SUM with " +
                std::to_string(s->tensor_factors.size()) + " factor tensors; troupe takes one");
      return troupe::reduce_op::premul_sum(to_troupe_dense(s->tensor_factors[0], name, "factor"));
    }
    default:
      break;
  }
  invalid(std::string(name) + ": unknown reduce op " + std::to_string(static_cast<int>(op.op_)));
}

std::vector<troupe::tensor_list> to_troupe_lists(const tensor_lists& lists, const char* op,
                                                 const std::string& what) {
  std::vector<troupe::tensor_list> r;
  r.reserve(lists.size());
  for (std::size_t i = 0; i < lists.size(); ++i)
    r.push_back(to_troupe_dense(lists[i], op, what + " list " + std::to_string(i) + ", tensor"));
  return r;
}

/// What a Work's future completes with, as gloo gives it: no lists -> an
/// empty List[Tensor]; one list -> List[Tensor]; several -> List[List[Tensor]].
c10::TypePtr future_type(const tensor_lists& outputs) {
  if (outputs.size() > 1)
    return c10::ListType::create(c10::ListType::create(c10::TensorType::get()));
  return c10::ListType::create(c10::TensorType::get());
}

c10::IValue future_value(const tensor_lists& outputs) {
  if (outputs.empty()) return c10::IValue(std::vector<at::Tensor>());
  if (outputs.size() > 1) {
    c10::List<c10::List<at::Tensor>> r;
    for (const auto& l : outputs) r.push_back(c10::List<at::Tensor>(l));
    return c10::IValue(r);
  }
  return c10::IValue(outputs[0]);
}

/// The future of one work and who completes it: the first of the pool (after
/// troupe's on_complete) and a thread returning from Work::wait.
struct completion {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  tensor_lists outputs;
  /// Ends the profiler's event of the call (set while a profiler records).
  std::function<void()> end_event;
  std::atomic<bool> started{false};

  /// Completes the future from `w` unless someone else began to; returns
  /// whether this call did.
  bool finish(const troupe::work& w) {
    if (started.exchange(true)) return false;
    if (end_event) end_event();
    if (w.is_success())
      future->markCompleted(future_value(outputs));
    else
      future->setError(w.exception());
    return true;
  }
};

class work_adapter final : public c10d::Work {
 public:
  /// c10d::Work starts the profiler's event `title` (with the inputs'
  /// shapes) when one is given; the event ends when the call does.
  work_adapter(troupe::work w, c10d::OpType type, tensor_lists outputs, int rank, const char* title,
               const c10::optional<std::vector<at::Tensor>>& inputs)
      : c10d::Work(rank, type, title, inputs),
        w_(std::move(w)),
        c_(std::make_shared<completion>()) {
    c_->future = c10::make_intrusive<c10::ivalue::Future>(future_type(outputs));
    c_->outputs = std::move(outputs);
    c_->end_event = std::exchange(recordFunctionEndCallback_, nullptr);
    w_.on_complete([c = c_](const troupe::work& done) {
      detail::post_callback([c, done] { c->finish(done); });
    });
  }

  bool isCompleted() override { return w_.is_completed(); }
  bool isSuccess() const override { return w_.is_success(); }
  std::exception_ptr exception() const override { return w_.exception(); }
  int sourceRank() const override { return w_.source_rank(); }
  std::vector<at::Tensor> result() override {
    wait(kNoTimeout);
    std::vector<at::Tensor> r;
    for (const auto& l : c_->outputs) r.insert(r.end(), l.begin(), l.end());
    return r;
  }
  void synchronize() override {}

  /// Drives troupe's operation (troupe's wait), so a blocking wait does not
  /// depend on anyone else's progress; throws what it failed with.
  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout == kNoTimeout)
      w_.wait();
    else
      w_.wait(timeout);
    // The future is complete before wait returns (getFuture().value() is
    // then safe): complete it here, or wait for the thread that does.
    if (!c_->finish(w_)) c_->future->wait();
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return c_->future; }

 private:
  troupe::work w_;
  std::shared_ptr<completion> c_;
};

// -- one troupe world per process for torch.distributed ------------------------------

std::mutex world_mtx;
std::weak_ptr<troupe::world> default_world;  // the world of the latest troupe default group

std::string random_token() {
  std::random_device rd;
  static const char* hex = "0123456789abcdef";
  std::string r;
  for (int i = 0; i < 32; ++i) r += hex[rd() % 16];
  return r;
}

/// A world over `store`. Without TROUPE_JOB_TOKEN, rank 0 makes the job's
/// token and shares it through the store (as safe as torch's store is).
std::shared_ptr<troupe::world> join_world(const c10::intrusive_ptr<c10d::Store>& c10d_store,
                                          int rank, int size, std::chrono::milliseconds timeout) {
  if (!c10d_store) invalid("ProcessGroupTroupe: null store");
  troupe::world_options o;
  o.store = wrap_store(c10d_store);
  o.rank = rank;
  o.world_size = size;
  o.timeout = timeout;
  const char* env_token = std::getenv("TROUPE_JOB_TOKEN");
  if (env_token && *env_token) {
    o.token = env_token;
  } else if (size > 1) {
    const std::string key = "troupe_torch/token";
    if (rank == 0) o.store->set(key, random_token());
    o.store->wait({key}, timeout);
    o.token = o.store->get_string(key);
  }
  return std::make_shared<troupe::world>(std::move(o));
}

std::shared_ptr<troupe::process_group> default_group_of(const std::shared_ptr<troupe::world>& w) {
  return std::shared_ptr<troupe::process_group>(w, &w->default_group());
}

}  // namespace

bool wait_for_completions(std::chrono::milliseconds timeout) {
  return detail::drain_callbacks(timeout);
}

c10::intrusive_ptr<c10d::Work> make_work(troupe::work w, c10d::OpType type, tensor_lists outputs,
                                         int rank, const char* profiling_title,
                                         const std::vector<at::Tensor>& inputs) {
  // Only while something records (a profiler): the event costs an
  // allocation and a copy of the inputs' list per call.
  if (!profiling_title || !at::hasCallbacks())
    return c10::make_intrusive<work_adapter>(std::move(w), type, std::move(outputs), rank, nullptr,
                                             c10::nullopt);
  return c10::make_intrusive<work_adapter>(std::move(w), type, std::move(outputs), rank,
                                           profiling_title, inputs);
}

// -- construction -------------------------------------------------------------------------

ProcessGroupTroupe::ProcessGroupTroupe(std::shared_ptr<troupe::process_group> group,
                                       std::shared_ptr<troupe::world> keep_alive)
    : c10d::ProcessGroup(group ? group->rank() : -1, group ? group->size() : 0),
      world_(std::move(keep_alive)),
      group_(std::move(group)) {
  if (!group_) invalid("ProcessGroupTroupe: null group");
  if (!group_->is_member())
    invalid("ProcessGroupTroupe: this rank is not a member of group '" + group_->name() + "'");
  init();
}

ProcessGroupTroupe::ProcessGroupTroupe(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                       int size, std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), world_(join_world(store, rank, size, timeout)) {
  group_ = default_group_of(world_);
  init();
}

ProcessGroupTroupe::~ProcessGroupTroupe() {
  // The last reference may go here, from Python (holding the GIL): the
  // group's and the world's threads are joined without it (callback_pool.hpp).
  detail::without_gil([this] {
    group_.reset();
    world_.reset();
  });
}

c10::intrusive_ptr<ProcessGroupTroupe> ProcessGroupTroupe::create(
    const c10d::DistributedBackendOptions& opts) {
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(opts.timeout);
  if (opts.global_ranks_in_group.empty()) {  // the default group: this process's world
    auto w = join_world(opts.store, opts.group_rank, opts.group_size, timeout);
    {
      std::lock_guard<std::mutex> g{world_mtx};
      default_world = w;
    }
    return c10::make_intrusive<ProcessGroupTroupe>(default_group_of(w), w);
  }
  std::shared_ptr<troupe::world> w;
  {
    std::lock_guard<std::mutex> g{world_mtx};
    w = default_world.lock();
  }
  if (!w)  // the default group is not troupe's: a world for this group alone
    return c10::make_intrusive<ProcessGroupTroupe>(opts.store, opts.group_rank, opts.group_size,
                                                   timeout);
  std::vector<int> ranks;
  for (auto r : opts.global_ranks_in_group) ranks.push_back(to_int(r, "new_group", "rank"));
  troupe::new_group_options o;
  o.timeout = timeout;
  o.use_local_synchronization = true;  // torch calls the creator on members only
  o.description = "torch group " + opts.group_id;
  auto group = w->new_group(std::move(ranks), o);
  if (!group || group->rank() != opts.group_rank)
    invalid("ProcessGroupTroupe: group '" + opts.group_id + "': torch says this is group rank " +
            std::to_string(opts.group_rank) + ", troupe's group has it as " +
            std::to_string(group ? group->rank() : -1));
  return c10::make_intrusive<ProcessGroupTroupe>(std::move(group), w);
}

// -- collectives ---------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  const char* op = "broadcast";
  auto w = group_->broadcast(to_troupe_dense(tensors, op, "tensor"),
                             {.root_rank = to_int(opts.rootRank, op, "root rank"),
                              .root_tensor = to_int(opts.rootTensor, op, "root tensor"),
                              .timeout = to_timeout(opts.timeout)});
  return make_work(std::move(w), c10d::OpType::BROADCAST, {tensors}, rank_, "troupe:broadcast",
                   tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  const char* op = "allreduce";
  if (!tensors.empty() && tensors[0].defined() && tensors[0].is_sparse())
    return detail::sparse_allreduce(*group_, tensors, opts.reduceOp, rank_);
  auto w = group_->allreduce(
      to_troupe_dense(tensors, op, "tensor"),
      {.op = to_reduce_op(opts.reduceOp, op), .timeout = to_timeout(opts.timeout)});
  return make_work(std::move(w), c10d::OpType::ALLREDUCE, {tensors}, rank_, "troupe:all_reduce",
                   tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const char* op = "allreduce_coalesced";
  auto w = group_->allreduce_coalesced(
      to_troupe_dense(tensors, op, "tensor"),
      {.op = to_reduce_op(opts.reduceOp, op), .timeout = to_timeout(opts.timeout)});
  return make_work(std::move(w), c10d::OpType::ALLREDUCE_COALESCED, {tensors}, rank_,
                   "troupe:all_reduce", tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  const char* op = "reduce";
  auto w = group_->reduce(to_troupe_dense(tensors, op, "tensor"),
                          {.op = to_reduce_op(opts.reduceOp, op),
                           .root_rank = to_int(opts.rootRank, op, "root rank"),
                           .root_tensor = to_int(opts.rootTensor, op, "root tensor"),
                           .timeout = to_timeout(opts.timeout)});
  return make_work(std::move(w), c10d::OpType::REDUCE, {tensors}, rank_, "troupe:reduce", tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* op = "allgather";
  auto w = group_->allgather(to_troupe_lists(outputs, op, "output"),
                             to_troupe_dense(inputs, op, "input"),
                             {.timeout = to_timeout(opts.timeout)});
  return make_work(std::move(w), c10d::OpType::ALLGATHER, outputs, rank_, "troupe:all_gather",
                   inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  const char* op = "_allgather_base";
  auto w = group_->allgather_into_tensor(to_troupe_dense(output, op, "output"),
                                         to_troupe_dense(input, op, "input"),
                                         {.timeout = to_timeout(opts.timeout)});
  return make_work(std::move(w), c10d::OpType::_ALLGATHER_BASE, {{output}}, rank_,
                   "troupe:all_gather_into_tensor", {input});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* op = "allgather_coalesced";
  auto w = group_->allgather_coalesced(to_troupe_lists(output_lists, op, "output"),
                                       to_troupe_dense(inputs, op, "input"),
                                       {.timeout = to_timeout(opts.timeout)});
  return make_work(std::move(w), c10d::OpType::ALLGATHER_COALESCED, output_lists, rank_,
                   "troupe:all_gather", inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const char* op = "gather";
  auto w = group_->gather(
      to_troupe_lists(outputs, op, "output"), to_troupe_dense(inputs, op, "input"),
      {.root_rank = to_int(opts.rootRank, op, "root rank"), .timeout = to_timeout(opts.timeout)});
  return make_work(std::move(w), c10d::OpType::GATHER, outputs, rank_, "troupe:gather", inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const char* op = "scatter";
  auto w = group_->scatter(
      to_troupe_dense(outputs, op, "output"), to_troupe_lists(inputs, op, "input"),
      {.root_rank = to_int(opts.rootRank, op, "root rank"), .timeout = to_timeout(opts.timeout)});
  return make_work(std::move(w), c10d::OpType::SCATTER, {outputs}, rank_, "troupe:scatter",
                   inputs.empty() ? std::vector<at::Tensor>{} : inputs[0]);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter";
  auto w = group_->reduce_scatter(
      to_troupe_dense(outputs, op, "output"), to_troupe_lists(inputs, op, "input"),
      {.op = to_reduce_op(opts.reduceOp, op), .timeout = to_timeout(opts.timeout)});
  return make_work(std::move(w), c10d::OpType::REDUCE_SCATTER, {outputs}, rank_,
                   "troupe:reduce_scatter", inputs.empty() ? std::vector<at::Tensor>{} : inputs[0]);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const char* op = "_reduce_scatter_base";
  auto w = group_->reduce_scatter_tensor(
      to_troupe_dense(output, op, "output"), to_troupe_dense(input, op, "input"),
      {.op = to_reduce_op(opts.reduceOp, op), .timeout = to_timeout(opts.timeout)});
  return make_work(std::move(w), c10d::OpType::_REDUCE_SCATTER_BASE, {{output}}, rank_,
                   "troupe:reduce_scatter_tensor", {input});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  const char* op = "alltoall_base";
  auto w = group_->alltoall_single(to_troupe_dense(output, op, "output"),
                                   to_troupe_dense(input, op, "input"), output_split_sizes,
                                   input_split_sizes, {.timeout = to_timeout(opts.timeout)});
  return make_work(std::move(w), c10d::OpType::ALLTOALL_BASE, {{output}}, rank_,
                   "troupe:all_to_all", {input});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  const char* op = "alltoall";
  auto w =
      group_->alltoall(to_troupe_dense(outputs, op, "output"), to_troupe_dense(inputs, op, "input"),
                       {.timeout = to_timeout(opts.timeout)});
  return make_work(std::move(w), c10d::OpType::ALLTOALL, {outputs}, rank_, "troupe:all_to_all",
                   inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::barrier(const c10d::BarrierOptions& opts) {
  auto w = group_->barrier({.timeout = to_timeout(opts.timeout), .device_ids = opts.device_ids});
  return make_work(std::move(w), c10d::OpType::BARRIER, {}, rank_, "troupe:barrier");
}

void ProcessGroupTroupe::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  group_->monitored_barrier({.timeout = to_timeout(opts.timeout), .wait_all_ranks = wait_all_ranks})
      .wait();
}

// -- point to point -------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::send(std::vector<at::Tensor>& tensors,
                                                        int dst_rank, int tag) {
  auto w = group_->send(to_troupe_dense(tensors, "send", "tensor"), dst_rank, tag);
  return make_work(std::move(w), c10d::OpType::SEND, {tensors}, rank_, "troupe:send", tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::recv(std::vector<at::Tensor>& tensors,
                                                        int src_rank, int tag) {
  auto w = group_->recv(to_troupe_dense(tensors, "recv", "tensor"), src_rank, tag);
  return make_work(std::move(w), c10d::OpType::RECV, {tensors}, rank_, "troupe:recv", tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTroupe::recvAnysource(std::vector<at::Tensor>& tensors,
                                                                 int tag) {
  auto w = group_->recv_any_source(to_troupe_dense(tensors, "recvAnysource", "tensor"), tag);
  return make_work(std::move(w), c10d::OpType::RECVANYSOURCE, {tensors}, rank_,
                   "troupe:recvAnySource", tensors);
}

// -- sequence numbers ----------------------------------------------------------------------

void ProcessGroupTroupe::setSequenceNumberForGroup() {}

uint64_t ProcessGroupTroupe::getSequenceNumberForGroup() {
  return group_->sequence_number();
}

}  // namespace troupe_torch
