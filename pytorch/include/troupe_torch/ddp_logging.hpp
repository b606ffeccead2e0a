#pragma once
/// What distributed_data_parallel reports about itself: the counterpart of
/// torch's DistributedDataParallel._get_ddp_logging_data() (c10d's
/// DDPLoggingData, filled by c10d::Logger), for a module on the CPU.
///
///   auto d = ddp.logging_data();
///   std::cout << d.bucket_sizes.size() << " buckets, "
///             << d.avg_backward_comm_time / 1e6 << " ms per backward's communication\n";
///   auto ints = d.ints_map(), strs = d.strs_map();  // torch's keys and formats
///
/// The fields set at construction are there from the start. The ones torch
/// samples during training (iteration, bucket rebuilding, the order gradients
/// became ready, unused parameters, times) are taken at the start of a
/// synchronised forward (grad mode on, outside no_sync) and describe the
/// synchronised iteration before it, as torch does: at the iterations 1 to
/// 10 and every sample_rate-th after (set_ddp_runtime_logging_sample_rate,
/// 100 by default). So after three synchronised iterations `iteration` is 2.
///
/// Times are in nanoseconds from the system clock, as torch's CPU timer:
/// forward_compute_time from the forward's start to its end (the start of
/// the backward's computation), backward_compute_time from there to the end
/// of the backward's computation (when every gradient was marked), and
/// backward_comm_time from the launch of the first bucket to the end of the
/// step (every bucket reduced and written back); the overlap is the time
/// from the first launch to the end of the computation. avg_* are their means
/// over the sampled iterations.
///
/// What differs from torch's report: backend_name is troupe's group's
/// (process_group::backend_name(), e.g. "actor"); a CPU module has no device
/// ids and no multi-device module; the gloo and NCCL environment variables are
/// not read; bucket sizes follow troupe's assignment, whose first bucket is
/// capped at bucket_cap_bytes when that is smaller than 1 MiB (torch keeps
/// 1 MiB).

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace troupe_torch {

struct ddp_logging_data {
  // -- at construction --------------------------------------------------------------
  int world_size = 0;
  int rank = 0;
  /// The module's class name without namespaces and without LibTorch's
  /// "Impl" suffix (torch::nn::SequentialImpl -> "Sequential"), as Python's
  /// type(module).__name__.
  std::string module_name;
  /// Always empty: CPU modules.
  std::vector<int> device_ids;
  int output_device = -1;
  bool broadcast_buffers = false;
  /// Whether the module contains a troupe_torch::SyncBatchNorm.
  bool has_sync_bn = false;
  std::int64_t bucket_cap_bytes = 0;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool static_graph = false;
  bool is_multi_device_module = false;
  std::string backend_name;
  /// The parameters that are reduced (those that require a gradient, each
  /// storage once, not ignored): how many, their bytes, their dtypes' names
  /// (sorted, each once: "float", "double", "c10::Half", ...).
  std::int64_t num_parameter_tensors = 0;
  std::int64_t total_parameter_size_bytes = 0;
  std::vector<std::string> dtypes;
  /// Bytes of each bucket at construction, in reduction order.
  std::vector<std::int64_t> bucket_sizes;
  /// MASTER_ADDR, MASTER_PORT, TORCH_DISTRIBUTED_DEBUG, CUDA_VISIBLE_DEVICES
  /// at construction ("N/A" when unset), by torch's key names.
  std::map<std::string, std::string> env;
  /// The registered comm hook's name; empty: none.
  std::string comm_hook;
  /// A join() has run with this module.
  bool join_uneven_inputs = false;

  // -- sampled during training (see the header comment) -----------------------
  /// The synchronised iteration the sampled fields describe; 0 before any.
  std::int64_t iteration = 0;
  /// Whether the last sample saw the buckets rebuilt (unset before the first sample).
  std::optional<bool> has_rebuilt_buckets;
  /// The buckets after their rebuild (set once, at the first sample after it).
  std::vector<std::int64_t> rebuilt_bucket_sizes;
  std::vector<std::vector<std::size_t>> rebuilt_per_bucket_param_indices;
  /// Parameter indices in the order their gradients' hooks fired in the
  /// sampled iteration (a parameter checkpointed twice appears twice).
  std::vector<std::size_t> prev_iteration_grad_ready_order_indices;
  /// Bytes of the parameters the sampled forward's output did not reach
  /// (find_unused_parameters), or that the first iteration of a static graph
  /// did not use. As torch's, it adds up over the samples while some are
  /// unused, and is unset while there is nothing to report.
  std::optional<std::int64_t> unused_parameter_size;
  /// Set once a sample was taken: the sampled iteration's times (0 where an
  /// event was not recorded) and their averages over the samples, ns.
  bool has_runtime_stats = false;
  std::int64_t forward_compute_time = 0, backward_compute_time = 0, backward_comm_time = 0,
               backward_compute_comm_overlap_time = 0;
  std::int64_t avg_forward_compute_time = 0, avg_backward_compute_time = 0,
               avg_backward_comm_time = 0, avg_backward_compute_comm_overlap_time = 0;
  /// The sampled iteration's events, ns since the epoch (0: not recorded).
  std::int64_t forward_compute_time_start = 0, backward_compute_time_start = 0,
               backward_comm_time_start = 0, backward_compute_time_end = 0,
               backward_comm_time_end = 0;

  // -- errors --------------------------------------------------------------------
  /// A backward failed in the reducer (e.g. "Expected to mark a variable
  /// ready only once."): the error's text, and the iteration it failed in.
  bool has_error = false;
  std::string error;

  /// torch's DDPLoggingData.strs_map: the same keys, values formatted as
  /// torch formats them (lists joined with ", ", a bucket's parameter indices
  /// with " "); keys torch only sets in some states are absent otherwise.
  std::map<std::string, std::string> strs_map() const;
  /// torch's DDPLoggingData.ints_map (booleans as 0 and 1).
  std::map<std::string, std::int64_t> ints_map() const;
};

}  // namespace troupe_torch
