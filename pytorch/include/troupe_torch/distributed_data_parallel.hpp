#pragma once
/// troupe_torch::distributed_data_parallel — DistributedDataParallel for
/// LibTorch's torch::nn::Module, on troupe's reducer (troupe/reducer.hpp).
///
///   auto model = std::make_shared<Net>();            // a torch::nn::Module
///   troupe_torch::distributed_data_parallel ddp{model, world.default_group()};
///   torch::optim::SGD opt{ddp.module()->parameters(), 0.1};
///   for (...) {
///     opt.zero_grad();
///     auto loss = torch::mse_loss(ddp.forward(x), y);  // this rank's slice
///     loss.backward();     // buckets are averaged while the backward goes on
///     opt.step();          // every rank holds the same averaged gradients
///   }
///
/// As torch's DDP: construction (collective) checks that every rank has the
/// same parameters and broadcasts parameters and buffers from rank 0; a hook
/// on each parameter's gradient accumulator marks it ready for the reducer,
/// which averages a bucket as soon as all its gradients are in (reverse
/// parameter order, 1 MiB first bucket, then 25 MiB, rebuilt after the first
/// step in the order gradients came); the end of the backward waits for every
/// bucket and leaves the averages in the parameters' .grad. forward()
/// broadcasts the buffers from rank 0 first (broadcast_buffers) and, with
/// find_unused_parameters, finds the parameters the output does not depend
/// on, which then contribute zeros at once. no_sync() accumulates gradients
/// locally until the next synchronised backward. Comm hooks:
/// register_comm_hook with troupe's (troupe::allreduce_hook,
/// fp16_compress_hook, bf16_compress_hook, powersgd_hook) or your own.
///
/// The forward's output may be any structure of tensors that
/// troupe_torch/apply_to_tensors.hpp walks (tensors, vectors, maps, optionals,
/// tuples, variants, their nestings, and your own types through an inspect
/// overload): find_unused_parameters sees every tensor in it. In a
/// synchronised forward the output's tensors that autograd computed (those
/// with a grad_fn) pass through a node of DDP's (torch's _DDPSink), whose
/// backward queues the end of the step on the outermost backward, so that a
/// reentrant backward inside the module (activation checkpointing,
/// troupe_torch/checkpoint.hpp) does not end it early; they are copies of the
/// module's, as torch's.
///
/// logging_data() is torch's _get_ddp_logging_data() (ddp_logging.hpp).
/// join() trains with uneven inputs across ranks as torch's Join context with
/// DDP's join hook: ranks that ran out of inputs shadow the collectives of
/// those still training.
///
/// Parameters that do not require grad are broadcast but not reduced. Call
/// backward on the thread that runs the forward (as torch's CPU autograd
/// does). The object must outlive the backward passes it takes part in; its
/// destructor removes its hooks from the module.

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "troupe/comm_hook.hpp"
#include "troupe/process_group.hpp"
#include "troupe/reducer.hpp"
#include "troupe_torch/apply_to_tensors.hpp"
#include "troupe_torch/ddp_logging.hpp"

namespace troupe_torch {

struct ddp_options {
  /// c10d's bucket_cap_mb (25 MiB) and first bucket (1 MiB).
  std::size_t bucket_cap_bytes = 25u * 1024 * 1024;
  std::size_t first_bucket_bytes = 1024u * 1024;
  /// The gradients live in the buckets: .grad is a view of its bucket, no copies.
  bool gradient_as_bucket_view = false;
  /// Parameters the forward's outputs do not reach contribute zeros.
  bool find_unused_parameters = false;
  /// The set of used parameters is the same in every step.
  bool static_graph = false;
  /// Broadcast buffers from rank 0 before every forward.
  bool broadcast_buffers = true;
  /// Bucket of the broadcasts at construction and of buffers.
  std::size_t broadcast_bucket_bytes = 250u * 1024 * 1024;
  /// Parameters and buffers (by their names in named_parameters/named_buffers) left alone.
  std::set<std::string> params_and_buffers_to_ignore = {};
};

/// How join() treats ranks that ran out of inputs (torch's Join and
/// DistributedDataParallel.join arguments).
struct join_options {
  /// true: the gradients are divided by the group's size, the joined ranks
  /// counting as ranks that contribute zeros (torch's default); false: by
  /// the number of ranks still training in that iteration. Only the default
  /// averaging is scaled; a comm hook's result is taken as it is, as torch
  /// takes it.
  bool divide_by_initial_world_size = true;
  /// When a rank runs out of inputs, every rank throws (the joined one "Rank
  /// R exhausted all inputs.", the others "Detected at least one rank that
  /// exhausted inputs. Throwing across all ranks.") instead of shadowing.
  bool throw_on_early_termination = false;
  /// false: join() just runs the training loop.
  bool enable = true;
};

/// What every distributed_data_parallel<M> shares (not tied to the module type).
class ddp_engine {
 public:
  ddp_engine(std::shared_ptr<torch::nn::Module> module, troupe::process_group& pg,
             ddp_options options);
  ~ddp_engine();
  ddp_engine(const ddp_engine&) = delete;
  ddp_engine& operator=(const ddp_engine&) = delete;

  /// Reduces buckets with `hook` instead of averaging; before the first backward.
  void register_comm_hook(troupe::comm_hook hook);

  /// What torch's _get_ddp_logging_data() reports (see ddp_logging.hpp).
  ddp_logging_data logging_data() const;
  /// Sample the runtime fields at iterations 1-10 and every `rate`-th after
  /// (torch's _set_ddp_runtime_logging_sample_rate; default 100, at least 1).
  void set_ddp_runtime_logging_sample_rate(int rate);

  /// Runs `train`, this rank's loop over its own inputs, and then shadows
  /// the other ranks until every rank has finished its loop (torch's
  /// `with Join([ddp]):` / `with ddp.join():`). Collective: every rank of the
  /// group calls it, with the same options. While a rank's loop still runs,
  /// each of its forwards tells the others that it trains; a rank whose loop
  /// ended answers every such forward with the collectives it would have
  /// issued (the buffers' broadcast, whether the backward synchronises, the
  /// buckets' reductions with zero gradients, the used-parameter bitmap), so
  /// the ranks still training reduce over the whole group. Buffers are
  /// broadcast from the highest rank still training. At the end every rank
  /// takes the parameters and buffers of the highest rank among the last to
  /// finish. An exception from `train` propagates at once, without
  /// shadowing. A joined rank's .grad holds the averages of the steps it
  /// shadowed.
  void join(const std::function<void()>& train, const join_options& options = {});

  /// Gradients accumulate locally while the guard lives (no communication);
  /// the next backward outside it synchronises the sum.
  class no_sync_guard {
   public:
    explicit no_sync_guard(ddp_engine& e) : e_(&e), before_(e.set_no_sync(true)) {}
    ~no_sync_guard() {
      if (e_) e_->set_no_sync(before_);
    }
    no_sync_guard(no_sync_guard&& o) noexcept
        : e_(std::exchange(o.e_, nullptr)), before_(o.before_) {}
    no_sync_guard(const no_sync_guard&) = delete;
    no_sync_guard& operator=(const no_sync_guard&) = delete;
    no_sync_guard& operator=(no_sync_guard&&) = delete;

   private:
    ddp_engine* e_;
    bool before_;
  };
  no_sync_guard no_sync() { return no_sync_guard{*this}; }

  /// Before a forward: the join protocol's collectives (inside join()), the
  /// buffers from rank 0 (broadcast_buffers; from the highest rank still
  /// training inside join()).
  void before_forward();
  /// After a forward, given the output's tensors in walking order: with
  /// find_unused_parameters, finds what they depend on; in a synchronised
  /// forward returns them with those autograd computed (with a grad_fn)
  /// replaced by DDP's pass-through copies (see the header comment).
  std::vector<at::Tensor> after_forward(std::vector<at::Tensor> outputs);

  /// The parameters the reducer synchronises, in its order.
  const std::vector<at::Tensor>& parameters() const;
  /// Their names.
  const std::vector<std::string>& parameter_names() const;
  /// The reducer (buckets, works, steps).
  troupe::reducer& reducer();
  troupe::process_group& group() const;

  /// The state (pytorch/src/ddp_state.hpp; named here for its autograd nodes).
  struct impl;

 private:
  bool set_no_sync(bool on);
  std::unique_ptr<impl> impl_;
};

template <class M>
class distributed_data_parallel : public ddp_engine {
 public:
  /// Collective: every rank of `pg` constructs one over the same architecture.
  distributed_data_parallel(std::shared_ptr<M> module, troupe::process_group& pg,
                            ddp_options options = {})
      : ddp_engine(module, pg, std::move(options)), module_(std::move(module)) {}
  /// From a module holder (TORCH_MODULE(Net) gives Net over NetImpl).
  distributed_data_parallel(torch::nn::ModuleHolder<M> holder, troupe::process_group& pg,
                            ddp_options options = {})
      : distributed_data_parallel(holder.ptr(), pg, std::move(options)) {}

  /// The module's forward, with DDP's work before and after; the output's
  /// tensors are found by troupe_torch::for_each_tensor.
  template <class... Args>
  auto forward(Args&&... args) {
    before_forward();
    auto out = module_->forward(std::forward<Args>(args)...);
    std::vector<at::Tensor> found;
    for_each_tensor(out, [&found](const at::Tensor& t) { found.push_back(t); });
    auto passed = after_forward(std::move(found));
    std::size_t k = 0;
    apply_to_tensors(out, [&passed, &k](at::Tensor& t) { t = std::move(passed[k++]); });
    return out;
  }

  const std::shared_ptr<M>& module() const noexcept { return module_; }
  M* operator->() const noexcept { return module_.get(); }

 private:
  std::shared_ptr<M> module_;
};

}  // namespace troupe_torch
