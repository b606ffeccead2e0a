#pragma once
/// PowerSGD gradient compression (Vogels et al., 2019; c10d's
/// powerSGD_hook and batched_powerSGD_hook): each gradient matrix M (n × m)
/// travels as two thin factors, P = M Q (n × r) and Q = Mᵀ P (m × r), found
/// by one step of subspace iteration per training step, so a bucket costs
/// (n + m) r elements on the wire instead of n m. With error feedback, what
/// compression loses in one step is added to the next step's gradient.
///
///   auto state = std::make_shared<troupe::powersgd_state>(
///       troupe::powersgd_options{.matrix_approximation_rank = 4, .start_powersgd_iter = 10});
///   reducer.register_comm_hook(troupe::powersgd_hook(pg, state));
///
/// The hooks issue collectives from continuations (hook_ordering::serial):
/// the bucket's group must carry nothing else while a step's buckets are in
/// flight. Host float32 and float64 buckets; the small matrix products and
/// the orthogonalisation use Eigen.

#include <cstdint>
#include <memory>

#include "troupe/comm_hook.hpp"
#include "troupe/process_group.hpp"

namespace troupe {

/// c10d's PowerSGDState arguments.
struct powersgd_options {
  /// r: the rank of the approximation (more: more accurate, more bytes).
  int matrix_approximation_rank = 1;
  /// Steps of plain averaging before compression starts (c10d's
  /// start_powerSGD_iter); must be > 1 with error feedback or warm start.
  std::uint64_t start_powersgd_iter = 1000;
  /// A gradient (viewed as shape[0] × the rest) is compressed only when
  /// (n + m) r · min_compression_rate < n m; others are averaged as they are.
  double min_compression_rate = 2;
  /// Adds the previous step's compression error to the gradient.
  bool use_error_feedback = true;
  /// Starts each step's subspace iteration from the previous step's Q.
  bool warm_start = true;
  /// Added to the column norms when orthogonalising (0: none; a zero column stays zero).
  double orthogonalization_epsilon = 0;
  /// Seeds the random initial Q (the same on every rank).
  std::uint64_t random_seed = 0;
};

/// What compression saved so far (c10d's compression_stats()).
struct powersgd_stats {
  /// numel_before / numel_after (0 before anything was compressed).
  double compression_rate = 0;
  std::uint64_t numel_before = 0;
  std::uint64_t numel_after = 0;
};

/// The state a PowerSGD hook keeps between steps: the error feedback, the
/// warm-start factors and the random generator, per bucket.
class powersgd_state {
 public:
  /// errc::invalid_argument for bad options, with c10d's text for
  /// start_powersgd_iter <= 1 with error feedback or warm start.
  explicit powersgd_state(const powersgd_options& options = {});
  ~powersgd_state();
  powersgd_state(const powersgd_state&) = delete;
  powersgd_state& operator=(const powersgd_state&) = delete;

  const powersgd_options& options() const noexcept;
  /// Steps seen by the hook (it advances at each step's last bucket).
  std::uint64_t iteration() const;
  /// Elements before and after compression, over all compressed steps.
  powersgd_stats compression_stats() const;

  struct impl;  ///< internal: used by the hooks
  impl& internals() const noexcept { return *impl_; }

 private:
  std::unique_ptr<impl> impl_;
};

/// Layer-wise PowerSGD: each gradient of the bucket that is worth it is
/// compressed on its own (r = min(n, m, rank)); the rest, and 1-D
/// gradients, are averaged uncompressed in the same allreduce as the P factors.
comm_hook powersgd_hook(process_group& pg, std::shared_ptr<powersgd_state> state);

/// Batched PowerSGD: the whole bucket, zero-padded to a square matrix, is
/// compressed as one (cheaper to compute, less accurate).
comm_hook batched_powersgd_hook(process_group& pg, std::shared_ptr<powersgd_state> state);

}  // namespace troupe
