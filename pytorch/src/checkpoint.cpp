// Reentrant activation checkpointing (troupe_torch/checkpoint.hpp), as
// torch.utils.checkpoint's CheckpointFunction: forward without grad, backward
// recomputes with grad and runs a backward of its own on the recomputation.

#include "troupe_torch/checkpoint.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <mutex>

#include "troupe/error.hpp"

namespace troupe_torch {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using fn_t = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// What the backward needs besides the saved inputs.
struct checkpoint_state : torch::CustomClassHolder {
  fn_t fn;
  bool preserve_rng_state = true;
  at::Tensor rng_state;  // the CPU generator's before the forward
};

at::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

struct checkpoint_function : torch::autograd::Function<checkpoint_function> {
  static variable_list forward(AutogradContext* ctx, c10::IValue state, at::TensorList inputs) {
    auto s = c10::static_intrusive_pointer_cast<checkpoint_state>(state.toCapsule());
    if (s->preserve_rng_state) s->rng_state = cpu_rng_state();
    ctx->saved_data["state"] = std::move(state);
    ctx->save_for_backward(inputs.vec());
    return s->fn(inputs.vec());  // grad mode is off in a custom function's forward
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!torch::autograd::Engine::get_default_engine().is_checkpoint_valid())
      throw troupe::error(troupe::errc::invalid_argument,
                          "checkpoint: Checkpointing is not compatible with .grad() or when an "
                          "`inputs` parameter is passed to .backward(). Please use .backward() "
                          "and do not pass its `inputs` argument.");
    auto s =
        c10::static_intrusive_pointer_cast<checkpoint_state>(ctx->saved_data["state"].toCapsule());
    variable_list inputs;
    for (const auto& t : ctx->get_saved_variables()) {
      auto d = t.detach();
      d.requires_grad_(t.requires_grad());
      inputs.push_back(d);
    }

    // Recompute under the forward's random state; the caller's comes back after.
    variable_list outputs;
    {
      at::Tensor surrounding;
      if (s->preserve_rng_state) {
        surrounding = cpu_rng_state();
        set_cpu_rng_state(s->rng_state);
      }
      try {
        torch::autograd::AutoGradMode grad_on{true};
        outputs = s->fn(inputs);
      } catch (...) {
        if (s->preserve_rng_state) set_cpu_rng_state(surrounding);
        throw;
      }
      if (s->preserve_rng_state) set_cpu_rng_state(surrounding);
    }

    variable_list with_grad, their_grads;
    for (std::size_t i = 0; i < outputs.size() && i < grads.size(); ++i)
      if (outputs[i].defined() && outputs[i].requires_grad()) {
        with_grad.push_back(outputs[i]);
        their_grads.push_back(grads[i]);
      }
    if (with_grad.empty())
      throw troupe::error(
          troupe::errc::invalid_argument,
          "checkpoint: none of output has requires_grad=True, this checkpoint() is not necessary");
    torch::autograd::backward(with_grad, their_grads);

    variable_list r{at::Tensor()};  // for `state`
    for (const auto& d : inputs) r.push_back(d.grad());
    return r;
  }
};

}  // namespace

std::vector<at::Tensor> checkpoint(const fn_t& fn, const std::vector<at::Tensor>& inputs,
                                   bool preserve_rng_state) {
  if (!fn) throw troupe::error(troupe::errc::invalid_argument, "checkpoint: no function");
  auto state = c10::make_intrusive<checkpoint_state>();
  state->fn = fn;
  state->preserve_rng_state = preserve_rng_state;
  return checkpoint_function::apply(c10::IValue::make_capsule(std::move(state)),
                                    at::TensorList(inputs));
}

at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn,
                      const at::Tensor& input, bool preserve_rng_state) {
  if (!fn) throw troupe::error(troupe::errc::invalid_argument, "checkpoint: no function");
  return checkpoint(
      [fn](const std::vector<at::Tensor>& xs) { return std::vector<at::Tensor>{fn(xs[0])}; },
      {input}, preserve_rng_state)[0];
}

}  // namespace troupe_torch
