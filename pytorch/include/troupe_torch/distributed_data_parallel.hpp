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
/// Parameters that do not require grad are broadcast but not reduced. Call
/// backward on the thread that runs the forward (as torch's CPU autograd
/// does). The object must outlive the backward passes it takes part in; its
/// destructor removes its hooks from the module.

#include <torch/nn/module.h>

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "troupe/comm_hook.hpp"
#include "troupe/process_group.hpp"
#include "troupe/reducer.hpp"

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

  /// Before a forward: the buffers from rank 0 (broadcast_buffers).
  void before_forward();
  /// After a forward: with find_unused_parameters, what `outputs` depend on.
  void after_forward(const std::vector<at::Tensor>& outputs);

  /// The parameters the reducer synchronises, in its order.
  const std::vector<at::Tensor>& parameters() const;
  /// Their names.
  const std::vector<std::string>& parameter_names() const;
  /// The reducer (buckets, works, steps).
  troupe::reducer& reducer();
  troupe::process_group& group() const;

 private:
  bool set_no_sync(bool on);
  struct impl;
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

  /// The module's forward, with DDP's work before and after.
  template <class... Args>
  auto forward(Args&&... args) {
    before_forward();
    auto out = module_->forward(std::forward<Args>(args)...);
    after_forward(tensors_of(out));
    return out;
  }

  const std::shared_ptr<M>& module() const noexcept { return module_; }
  M* operator->() const noexcept { return module_.get(); }

 private:
  static std::vector<at::Tensor> tensors_of(const at::Tensor& t) { return {t}; }
  static std::vector<at::Tensor> tensors_of(const std::vector<at::Tensor>& ts) { return ts; }
  template <class... Ts>
  static std::vector<at::Tensor> tensors_of(const std::tuple<Ts...>& t) {
    std::vector<at::Tensor> r;
    std::apply([&](const auto&... x) { (append(r, x), ...); }, t);
    return r;
  }
  template <class T>
  static void append(std::vector<at::Tensor>& r, const T& x) {
    if constexpr (std::is_same_v<T, at::Tensor>) r.push_back(x);
  }
  std::shared_ptr<M> module_;
};

}  // namespace troupe_torch
