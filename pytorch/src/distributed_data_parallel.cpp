// distributed_data_parallel for LibTorch: torch's autograd feeds troupe's
// reducer (see troupe_torch/distributed_data_parallel.hpp). A post hook on
// each parameter's gradient accumulator marks the parameter ready; the first
// mark of a backward queues the end of the step on the autograd engine,
// which waits for the buckets and puts the averages into .grad.

#include "troupe_torch/distributed_data_parallel.hpp"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <unordered_set>

#include "troupe/error.hpp"
#include "troupe/param_sync.hpp"
#include "troupe_torch/tensor.hpp"

namespace troupe_torch {
namespace {

[[noreturn]] void refuse(const std::string& what) {
  throw troupe::error(troupe::errc::invalid_argument, "distributed_data_parallel: " + what);
}

/// The named tensors of a module not in `ignore`, each storage once.
void collect(const torch::OrderedDict<std::string, at::Tensor>& named,
             const std::set<std::string>& ignore, std::vector<at::Tensor>& tensors,
             std::vector<std::string>& names) {
  std::unordered_set<const void*> seen;
  for (const auto& item : named) {
    if (ignore.count(item.key()) || !item.value().defined()) continue;
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;  // shared
    tensors.push_back(item.value());
    names.push_back(item.key());
  }
}

troupe::tensor_list as_troupe(const std::vector<at::Tensor>& ts,
                              const std::vector<std::string>& names, const char* op) {
  troupe::tensor_list r;
  for (std::size_t i = 0; i < ts.size(); ++i)
    r.push_back(to_troupe_dense(ts[i].detach(), op, names[i]));
  return r;
}

}  // namespace

struct ddp_engine::impl {
  std::shared_ptr<torch::nn::Module> module;
  troupe::process_group& pg;
  ddp_options opts;
  std::vector<at::Tensor> params;  // reduced: those that require grad
  std::vector<std::string> names;
  std::unique_ptr<troupe::reducer> red;
  troupe::tensor_list copies;     // copy mode: where the averages land
  std::vector<at::Tensor> views;  // .grad of each parameter (bucket views or copies)
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<std::uintptr_t> hook_keys;
  bool no_sync = false;
  bool in_step = false;
  std::vector<char> used_without_sync;  // marked during no_sync since the last synchronised step
  std::vector<char> reachable;          // from the last forward's outputs (find_unused_parameters)
  bool know_reachable = false;

  impl(std::shared_ptr<torch::nn::Module> m, troupe::process_group& g, ddp_options o)
      : module(std::move(m)), pg(g), opts(std::move(o)) {}

  bool view_mode() const { return opts.gradient_as_bucket_view; }

  at::Tensor grad_tensor(std::size_t i) const {
    return to_torch(view_mode() ? red->gradient(i) : copies[i]);
  }

  /// Parameter i's gradient is final for this backward.
  void on_ready(std::size_t i) {
    if (no_sync) {
      used_without_sync[i] = 1;
      return;
    }
    if (!in_step) begin_step();
    mark(i);
  }

  void mark(std::size_t i) {
    auto& p = params[i];
    const at::Tensor g = p.grad();
    if (!g.defined()) {
      red->mark_unused(i);  // an accumulator ran without a gradient
      return;
    }
    if (view_mode()) {
      auto& v = views[i];
      if (g.data_ptr() != v.data_ptr()) {  // a fresh .grad: move it into its bucket
        torch::autograd::AutoGradMode no_grad{false};
        v.copy_(g);
        p.mutable_grad() = v;
      }
      red->mark_ready(i);
    } else {
      red->mark_ready(i, to_troupe(g.is_contiguous() ? g : g.contiguous()));
    }
  }

  void begin_step() {
    in_step = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_step(); });
    if (opts.find_unused_parameters && !opts.static_graph && know_reachable) {
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (reachable[i]) continue;
        // Used only in earlier no_sync backwards: its accumulated gradient counts.
        if (used_without_sync[i] && params[i].grad().defined())
          mark(i);
        else
          red->mark_unused(i);
      }
    }
  }

  void finish_step() {
    in_step = false;
    know_reachable = false;
    std::fill(used_without_sync.begin(), used_without_sync.end(), 0);
    const auto report = red->finish_step();
    std::vector<char> untouched(params.size(), 0);
    for (auto i : report.globally_unused_parameters) untouched[i] = 1;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (report.buckets_rebuilt && view_mode()) views[i] = grad_tensor(i);  // the new buckets
      if (untouched[i] && !view_mode()) continue;  // no rank used it: .grad stays as it is
      auto& p = params[i];
      if (!p.grad().defined() || p.grad().data_ptr() != views[i].data_ptr())
        p.mutable_grad() = views[i];
    }
  }

  void find_reachable(const std::vector<at::Tensor>& outputs) {
    std::unordered_set<const torch::autograd::Node*> seen;
    std::vector<torch::autograd::Node*> todo;
    for (const auto& t : outputs) {
      if (!t.defined() || !t.requires_grad()) continue;
      auto fn = t.grad_fn() ? t.grad_fn() : torch::autograd::impl::try_get_grad_accumulator(t);
      if (fn && seen.insert(fn.get()).second) todo.push_back(fn.get());
    }
    while (!todo.empty()) {
      auto* n = todo.back();
      todo.pop_back();
      for (const auto& e : n->next_edges())
        if (e.function && seen.insert(e.function.get()).second) todo.push_back(e.function.get());
    }
    for (std::size_t i = 0; i < params.size(); ++i)
      reachable[i] = seen.count(accumulators[i].get()) ? 1 : 0;
    know_reachable = true;
  }
};

ddp_engine::ddp_engine(std::shared_ptr<torch::nn::Module> module, troupe::process_group& pg,
                       ddp_options options)
    : impl_(std::make_unique<impl>(std::move(module), pg, std::move(options))) {
  auto& s = *impl_;
  if (!s.module) refuse("null module");
  // Parameters (each storage once) and buffers; those that need a gradient are reduced.
  std::vector<at::Tensor> all_params, buffers;
  std::vector<std::string> all_names, buffer_names;
  collect(s.module->named_parameters(), s.opts.params_and_buffers_to_ignore, all_params, all_names);
  collect(s.module->named_buffers(), s.opts.params_and_buffers_to_ignore, buffers, buffer_names);
  for (std::size_t i = 0; i < all_params.size(); ++i)
    if (all_params[i].requires_grad()) {
      s.params.push_back(all_params[i]);
      s.names.push_back(all_names[i]);
    }
  if (s.params.empty()) refuse("the module has no parameter that requires a gradient");

  // Every rank starts from rank 0's parameters and buffers.
  auto states = as_troupe(all_params, all_names, "distributed_data_parallel");
  auto bufs = as_troupe(buffers, buffer_names, "distributed_data_parallel");
  states.insert(states.end(), bufs.begin(), bufs.end());
  troupe::sync_params_and_buffers(pg, states, s.opts.broadcast_bucket_bytes, 0);

  // The reducer over one gradient tensor per parameter (collective: it checks
  // that every rank has the same parameters).
  troupe::tensor_list grads;
  for (const auto& p : s.params)
    grads.push_back(troupe::tensor::zeros(p.sizes().vec(),
                                          to_troupe_dtype(p.scalar_type(), "a parameter"),
                                          to_troupe(p.detach()).get_device()));
  troupe::reducer_options ro;
  ro.bucket_cap_bytes = s.opts.bucket_cap_bytes;
  ro.first_bucket_bytes = std::min(s.opts.first_bucket_bytes, s.opts.bucket_cap_bytes);
  ro.gradient_as_bucket_view = s.opts.gradient_as_bucket_view;
  ro.find_unused_parameters = s.opts.find_unused_parameters;
  ro.static_graph = s.opts.static_graph;
  ro.parameter_names = s.names;
  s.red = std::make_unique<troupe::reducer>(pg, grads, ro);
  if (!s.view_mode()) s.copies = grads;
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    s.views.push_back(s.grad_tensor(i));
    // A gradient that exists already moves into its bucket view.
    if (s.view_mode() && s.params[i].grad().defined()) {
      torch::autograd::AutoGradMode no_grad{false};
      s.views[i].copy_(s.params[i].grad());
      s.params[i].mutable_grad() = s.views[i];
    }
  }
  s.used_without_sync.assign(s.params.size(), 0);
  s.reachable.assign(s.params.size(), 1);

  // A post hook on each gradient accumulator: runs once .grad holds this
  // backward's contribution.
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(s.params[i]);
    if (!acc) refuse("parameter '" + s.names[i] + "' has no gradient accumulator (is it a leaf?)");
    auto* self = impl_.get();
    s.hook_keys.push_back(
        acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [self, i](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list&) {
              self->on_ready(i);
              return outputs;
            })));
    s.accumulators.push_back(std::move(acc));
  }
}

ddp_engine::~ddp_engine() {
  auto& s = *impl_;
  for (std::size_t i = 0; i < s.accumulators.size(); ++i)
    s.accumulators[i]->del_post_hook(s.hook_keys[i]);
}

void ddp_engine::register_comm_hook(troupe::comm_hook hook) {
  impl_->red->register_comm_hook(std::move(hook));
}

bool ddp_engine::set_no_sync(bool on) {
  return std::exchange(impl_->no_sync, on);
}

void ddp_engine::before_forward() {
  auto& s = *impl_;
  if (!s.opts.broadcast_buffers || s.pg.size() == 1) return;
  // Read the buffers again: a module may replace a buffer tensor.
  std::vector<at::Tensor> buffers;
  std::vector<std::string> names;
  collect(s.module->named_buffers(), s.opts.params_and_buffers_to_ignore, buffers, names);
  if (buffers.empty()) return;
  troupe::broadcast_coalesced(s.pg, as_troupe(buffers, names, "distributed_data_parallel.forward"),
                              s.opts.broadcast_bucket_bytes, 0);
}

void ddp_engine::after_forward(const std::vector<at::Tensor>& outputs) {
  auto& s = *impl_;
  if (s.opts.find_unused_parameters && !s.opts.static_graph && !s.no_sync &&
      torch::autograd::GradMode::is_enabled())
    s.find_reachable(outputs);
}

const std::vector<at::Tensor>& ddp_engine::parameters() const {
  return impl_->params;
}

const std::vector<std::string>& ddp_engine::parameter_names() const {
  return impl_->names;
}

troupe::reducer& ddp_engine::reducer() {
  return *impl_->red;
}

troupe::process_group& ddp_engine::group() const {
  return impl_->pg;
}

}  // namespace troupe_torch
