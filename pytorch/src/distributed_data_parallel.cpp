// distributed_data_parallel for LibTorch: torch's autograd feeds troupe's
// reducer (see troupe_torch/distributed_data_parallel.hpp and ddp_state.hpp).
// A post hook on each parameter's gradient accumulator marks the parameter
// ready; the step's first mark, or the backward of the sink node on the
// forward's output, queues the end of the step on the autograd engine, which
// waits for the buckets and puts the averages into .grad.

#include "troupe_torch/distributed_data_parallel.hpp"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <unordered_set>

#include "ddp_state.hpp"
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

/// torch's _DDPSink: passes the forward's outputs through (as copies) so that
/// their backward first reaches this node, in the outermost backward.
struct ddp_sink : torch::autograd::Function<ddp_sink> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                std::int64_t state, at::TensorList outputs) {
    ctx->saved_data["ddp"] = state;
    torch::autograd::variable_list r;
    for (const auto& t : outputs) r.push_back(t.clone());
    return r;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    reinterpret_cast<ddp_engine::impl*>(ctx->saved_data["ddp"].toInt())->on_sink_backward();
    torch::autograd::variable_list r{at::Tensor()};  // for `state`
    r.insert(r.end(), grads.begin(), grads.end());
    return r;
  }
};

}  // namespace

at::Tensor ddp_engine::impl::grad_tensor(std::size_t i) const {
  return to_torch(view_mode() ? red->gradient(i) : copies[i]);
}

void ddp_engine::impl::on_ready(std::size_t i) {
  if (no_sync) {
    used_without_sync[i] = 1;
    return;
  }
  if (!in_step) begin_step();
  ++marks[i];
  log.ready_order.push_back(i);
  try {
    mark(i);
  } catch (const std::exception& e) {
    log_error(e.what());
    throw;
  }
  if (log.events[std::size_t(ddp_event::backward_comm_start)] < 0 && should_collect() &&
      red->bucket_work(0).valid())
    record(ddp_event::backward_comm_start);
}

void ddp_engine::impl::on_sink_backward() {
  if (!no_sync && !in_step) begin_step();
}

void ddp_engine::impl::mark(std::size_t i) {
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

void ddp_engine::impl::begin_step() {
  in_step = true;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { end_step(); });
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

void ddp_engine::impl::end_step() {
  const auto step_marks = marks;  // finish() resets them
  if (should_collect()) record(ddp_event::backward_compute_end);
  if (should_collect() && log.events[std::size_t(ddp_event::backward_comm_start)] < 0)
    record(ddp_event::backward_comm_start);  // static_graph's first step launches here
  const bool first = red->steps() == 0;
  try {
    finish(join_scale());
  } catch (const std::exception& e) {
    log_error(e.what());
    throw;
  }
  if (first) {
    if (opts.static_graph) static_marks = step_marks;
    // c10d rebuilds its buckets after the first iteration that pushes its
    // order (static_graph: the second); troupe's reducer after the first.
    if (opts.static_graph || !opts.find_unused_parameters)
      log.rebuilt_at = opts.static_graph ? 2 : 1;
    if (opts.static_graph)
      for (std::size_t i = 0; i < step_marks.size(); ++i)
        if (step_marks[i] == 0) log.unused.push_back(i);
  }
  if (should_collect()) record(ddp_event::backward_comm_end);
}

void ddp_engine::impl::finish(double scale) {
  in_step = false;
  know_reachable = false;
  std::fill(used_without_sync.begin(), used_without_sync.end(), 0);
  std::fill(marks.begin(), marks.end(), 0);
  const auto report = red->finish_step();
  std::vector<char> untouched(params.size(), 0);
  for (auto i : report.globally_unused_parameters) untouched[i] = 1;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (report.buckets_rebuilt && view_mode()) views[i] = grad_tensor(i);  // the new buckets
    if (untouched[i] && !view_mode()) continue;  // no rank used it: .grad stays as it is
    auto& p = params[i];
    if (!p.grad().defined() || p.grad().data_ptr() != views[i].data_ptr())
      p.mutable_grad() = views[i];
    if (scale != 1.0 && !untouched[i]) {
      torch::autograd::AutoGradMode no_grad{false};
      views[i].mul_(scale);
    }
  }
}

void ddp_engine::impl::find_reachable(const std::vector<at::Tensor>& outputs) {
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
  log.unused.clear();
  for (std::size_t i = 0; i < params.size(); ++i) {
    reachable[i] = seen.count(accumulators[i].get()) ? 1 : 0;
    if (!reachable[i]) log.unused.push_back(i);
  }
  know_reachable = true;
}

bool ddp_engine::impl::will_sync_buffers() const {
  if (!require_forward_param_sync || !opts.broadcast_buffers || pg.size() == 1) return false;
  std::vector<at::Tensor> buffers;
  std::vector<std::string> buffer_names;
  collect(module->named_buffers(), opts.params_and_buffers_to_ignore, buffers, buffer_names);
  return !buffers.empty();
}

void ddp_engine::impl::sync_buffers(int src) {
  // Read the buffers again: a module may replace a buffer tensor.
  std::vector<at::Tensor> buffers;
  std::vector<std::string> buffer_names;
  collect(module->named_buffers(), opts.params_and_buffers_to_ignore, buffers, buffer_names);
  troupe::broadcast_coalesced(pg,
                              as_troupe(buffers, buffer_names, "distributed_data_parallel.forward"),
                              opts.broadcast_bucket_bytes, src);
}

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
  s.marks.assign(s.params.size(), 0);
  s.log_construction();

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
  auto name = hook.name;
  impl_->red->register_comm_hook(std::move(hook));
  impl_->has_hook = true;
  impl_->log.data.comm_hook = name;
}

bool ddp_engine::set_no_sync(bool on) {
  return std::exchange(impl_->no_sync, on);
}

void ddp_engine::before_forward() {
  auto& s = *impl_;
  const bool synced = torch::autograd::GradMode::is_enabled() && !s.no_sync;
  if (synced) {
    s.sample();
    ++s.iterations;
    if (s.should_collect()) {
      s.log.events.fill(-1);
      s.record(ddp_event::forward_start);
    }
  }
  if (s.join.active) s.join_before_forward();
  if (s.will_sync_buffers()) s.sync_buffers(s.join.active ? s.buffer_source() : 0);
  if (s.join.active) {
    // Tell the joined ranks whether this iteration's backward synchronises
    // (nobody here needs the answer; it is waited for at the next forward).
    s.join.requires_sync = troupe::tensor::from_vector<float>({synced ? 1.0f : 0.0f});
    s.join.requires_sync_work = s.pg.allreduce(s.join.requires_sync);
  }
}

std::vector<at::Tensor> ddp_engine::after_forward(std::vector<at::Tensor> outputs) {
  auto& s = *impl_;
  const bool synced = torch::autograd::GradMode::is_enabled() && !s.no_sync;
  s.require_forward_param_sync = synced;
  if (!synced) return outputs;
  if (s.should_collect()) s.record(ddp_event::backward_compute_start);
  s.log.ready_order.clear();
  if (s.opts.find_unused_parameters && !s.opts.static_graph) s.find_reachable(outputs);

  std::vector<at::Tensor> through;
  for (const auto& t : outputs)
    if (t.defined() && t.grad_fn()) through.push_back(t);
  if (through.empty()) return outputs;
  auto passed = ddp_sink::apply(reinterpret_cast<std::int64_t>(&s), at::TensorList(through));
  std::size_t k = 0;
  for (auto& t : outputs)
    if (t.defined() && t.grad_fn()) t = passed[k++];
  return outputs;
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
