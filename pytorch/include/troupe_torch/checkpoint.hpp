#pragma once
/// Activation checkpointing for LibTorch (torch.utils.checkpoint.checkpoint
/// with use_reentrant=True, which LibTorch lacks): the forward of `fn` runs
/// without keeping its activations, and the backward runs `fn` again with
/// grad mode on and back-propagates through that recomputation, in a
/// backward of its own inside the outer one (reentrant).
///
///   x = layer1(x);
///   x = troupe_torch::checkpoint([&](const at::Tensor& h) { return layer2(h); }, x);
///   loss(x).backward();  // recomputes layer2's forward, then its backward
///
/// As torch's: the CPU generator's state is saved before the forward and
/// restored around the recomputation (preserve_rng_state), so dropout draws
/// the same masks; inputs that require a gradient get it; the outputs of the
/// recomputation that require a gradient are back-propagated. The parameters
/// `fn` uses get their gradients from the inner backward: with
/// distributed_data_parallel their hooks fire there, once per checkpointed
/// use (twice for a layer checkpointed twice), which only static_graph
/// accepts (torch's rule). Calling autograd::grad() or passing `inputs` to
/// backward through a checkpoint is refused, as torch refuses it. CPU
/// tensors only (no CUDA generator state is kept). The CPU generator is the
/// process's: ranks that share a process and draw random numbers inside
/// checkpointed functions at the same time disturb each other's draws (give
/// such functions generators of their own).

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace troupe_torch {

/// fn(inputs) checkpointed; `inputs` as given to fn (at least one should
/// require a gradient, or no gradient flows to fn's parameters).
std::vector<at::Tensor> checkpoint(
    const std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>& fn,
    const std::vector<at::Tensor>& inputs, bool preserve_rng_state = true);

/// The one-tensor form: fn(input) checkpointed.
at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn,
                      const at::Tensor& input, bool preserve_rng_state = true);

}  // namespace troupe_torch
