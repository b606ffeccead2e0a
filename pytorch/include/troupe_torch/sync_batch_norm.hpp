#pragma once
/// torch.nn.SyncBatchNorm for LibTorch: batch normalisation whose statistics,
/// in training, are those of the whole batch spread over the ranks of a
/// troupe group, forward and backward (on troupe/sync_batch_norm.hpp).
///
///   auto bn = troupe_torch::SyncBatchNorm(
///       troupe_torch::SyncBatchNormOptions(16).process_group(&world.default_group()));
///   auto y = bn(x);  // x: (N, 16, *) on this rank; N may differ between ranks, even be 0
///
///   // or: every BatchNorm1d/2d/3d of a model becomes a SyncBatchNorm
///   auto model = troupe_torch::convert_sync_batchnorm(net.ptr(), world.default_group());
///
/// As torch's: in training the output is the batch norm of the ranks'
/// inputs taken together (each rank gets its own slice), the running mean
/// and (unbiased) variance are updated with the whole batch's, and the
/// input's gradient is that of the whole batch's loss (the sum of the ranks'
/// losses); the weight's and bias's gradients are this rank's share, which
/// distributed_data_parallel's averaging sums over the ranks (divided by their
/// number, as it divides every gradient). momentum unset gives the
/// cumulative average (1 / num_batches_tracked). In eval mode the running
/// statistics are used and nothing is synchronised; without running
/// statistics, eval mode normalises each rank's batch alone. Without a group,
/// or with a group of one rank, it is plain batch normalisation.
///
/// Every rank of the group must run the module's forward (and, in training,
/// its backward) at the same point of its collectives, with the same number
/// of channels; in a backward that also reduces DDP buckets on the same group
/// that holds as long as the ranks' graphs are the same (their collectives
/// then come in the same order). Float32 and float64 inputs on the CPU.

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>

#include "troupe/process_group.hpp"

namespace troupe_torch {

struct SyncBatchNormOptions {
  using group_ptr = troupe::process_group*;
  /* implicit */ SyncBatchNormOptions(std::int64_t num_features) : num_features_(num_features) {}
  /// C, the input's second dimension.
  TORCH_ARG(std::int64_t, num_features);
  TORCH_ARG(double, eps) = 1e-5;
  /// Unset: the cumulative moving average.
  TORCH_ARG(c10::optional<double>, momentum) = 0.1;
  /// A learned weight and bias per channel.
  TORCH_ARG(bool, affine) = true;
  TORCH_ARG(bool, track_running_stats) = true;
  /// The ranks whose inputs form the batch; it must outlive the module.
  /// nullptr: this rank's input alone (plain batch normalisation).
  TORCH_ARG(group_ptr, process_group) = nullptr;
};

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(const SyncBatchNormOptions& options);
  /// Over existing tensors (what convert_sync_batchnorm does): registers
  /// them, not new ones, as the weight and bias (undefined without affine)
  /// and the running statistics (undefined without track_running_stats).
  SyncBatchNormImpl(const SyncBatchNormOptions& options, at::Tensor weight, at::Tensor bias,
                    at::Tensor running_mean, at::Tensor running_var,
                    at::Tensor num_batches_tracked);

  /// (N, C, *) -> the same shape.
  at::Tensor forward(const at::Tensor& input);

  void reset() override;
  void reset_running_stats();
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  SyncBatchNormOptions options;
  at::Tensor weight;               ///< [C], with affine
  at::Tensor bias;                 ///< [C], with affine
  at::Tensor running_mean;         ///< [C], with track_running_stats
  at::Tensor running_var;          ///< [C], with track_running_stats
  at::Tensor num_batches_tracked;  ///< int64 scalar, with track_running_stats
};

TORCH_MODULE(SyncBatchNorm);

/// `module` with every BatchNorm1d, BatchNorm2d and BatchNorm3d in it (the
/// module itself or any descendant) replaced by a SyncBatchNorm over `pg`
/// with its options, sharing its weight, bias and running statistics (the
/// same tensors), as torch.nn.SyncBatchNorm.convert_sync_batchnorm; like
/// torch's, the new modules start in training mode. Returns the replacement
/// when `module` itself is a batch norm, else `module`, changed in place:
/// children are replaced through Module::replace_module, and the containers
/// torch::nn::Sequential and torch::nn::ModuleList are rebuilt with the
/// replacements (their parents then hold the new container). A module of
/// your own that keeps a child in a member (e.g. `torch::nn::BatchNorm2d bn`)
/// still calls the old one through it: read it back after the conversion
/// (LibTorch's rule for replace_module), e.g. from named_children(), or hold
/// such children in a Sequential.
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          troupe::process_group& pg);

}  // namespace troupe_torch
