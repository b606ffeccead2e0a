#pragma once
/// Synchronised batch normalisation (torch.nn.SyncBatchNorm's function):
/// a batch split over the ranks of a group is normalised with the statistics
/// of the whole batch, and its backward uses the whole batch's gradient sums.
/// Ranks may hold no samples (even all of them): they still take part in the
/// collectives, and nothing becomes NaN.
///
/// Inputs are contiguous float32 or float64 tensors of shape (N, C, *):
/// statistics are per channel C, over N and the trailing dimensions. Both
/// calls are collective and block; every rank passes the same C and the same
/// `needs`.

#include <array>
#include <cstdint>

#include "troupe/process_group.hpp"
#include "troupe/tensor.hpp"

namespace troupe {

/// The whole batch's statistics per channel.
struct batch_norm_stats {
  tensor mean;             ///< [C], the input's dtype
  tensor invstd;           ///< [C]: 1 / sqrt(biased variance + eps)
  std::int64_t count = 0;  ///< values per channel over every rank
};

struct sync_batch_norm_options {
  double eps = 1e-5;
  /// running = (1 - momentum) * running + momentum * batch (unbiased variance).
  double momentum = 0.1;
};

/// Each rank's count, mean and variance per channel are all-gathered (a rank
/// without samples sends zeros and is left out) and combined exactly (Chan's
/// parallel formulas, in float64). running_mean and running_var, when
/// defined ([C]), are updated when the batch is not empty; with a single
/// value per channel the variance's unbiased correction is skipped.
batch_norm_stats sync_batch_norm_stats(process_group& pg, const tensor& input,
                                       const sync_batch_norm_options& opts = {},
                                       tensor running_mean = {}, tensor running_var = {});

/// What the forward keeps for the backward.
struct sync_batch_norm_saved {
  tensor input;
  tensor weight;  ///< undefined: no affine weight
  batch_norm_stats stats;
};

struct sync_batch_norm_result {
  tensor output;  ///< (x - mean) * invstd * weight + bias, shaped as the input
  sync_batch_norm_saved saved;
};

/// Normalises `input` with the group's statistics. `weight` and `bias` ([C])
/// may be undefined. errc::invalid_argument with "Expected more than 1 value
/// per channel when training, got input size 1" for one value per channel on
/// one rank, as torch.
sync_batch_norm_result sync_batch_norm_forward(process_group& pg, const tensor& input,
                                               const tensor& weight, const tensor& bias,
                                               tensor running_mean, tensor running_var,
                                               const sync_batch_norm_options& opts = {});

/// Gradients with respect to input, weight and bias; undefined where not
/// needed. A rank without samples gets an empty input gradient and zero
/// weight and bias gradients (this rank's share; summing them over ranks,
/// as the reducer does, gives the whole batch's).
struct sync_batch_norm_grads {
  tensor input;
  tensor weight;
  tensor bias;
};

/// The backward: local sums of grad_output and grad_output * (x - mean), one
/// allreduce of them when the input's gradient is needed (needs[0]; the same on
/// every rank), then the input's gradient from the whole batch's sums.
sync_batch_norm_grads sync_batch_norm_backward(process_group& pg, const tensor& grad_output,
                                               const sync_batch_norm_saved& saved,
                                               std::array<bool, 3> needs = {true, true, true});

}  // namespace troupe
