#pragma once
/// troupe::reducer — DDP's gradient synchronisation without an autograd
/// engine: the caller says when each gradient is final ("ready" is a call),
/// and the reducer averages the gradients over the group in buckets, each
/// bucket as soon as all its gradients are ready, while the caller's
/// backward goes on.
///
///   troupe::reducer red{pg, {w1_grad, b1_grad, w2_grad, b2_grad}};
///   red.register_comm_hook(troupe::fp16_compress_hook(pg));  // optional
///   for (...) {                           // each step
///     backward of layer 2;  red.mark_ready(3);  red.mark_ready(2);
///     backward of layer 1;  red.mark_ready(1);  red.mark_ready(0);
///     red.finish_step();                   // the gradients now hold the averages
///     optimizer step;
///   }
///
/// As c10d's Reducer: parameters are bucketed in reverse order (gradients
/// come last layer first), the first bucket to be reduced capped at
/// first_bucket_bytes (1 MiB) so that communication starts early and the
/// others at bucket_cap_bytes (25 MiB), one bucket per dtype and device at a
/// time (compute_bucket_assignment_by_size). Buckets are launched in index
/// order on every rank, whatever order their gradients became ready in.
///
/// Construction is collective: it checks that every rank has the same
/// parameters (verify_param_shapes_across_processes). The gradient tensors
/// must stay valid; don't write into a gradient between mark_ready and
/// finish_step. Calls are thread-safe; buckets launched from several threads
/// still go out in index order.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/comm_hook.hpp"
#include "troupe/process_group.hpp"
#include "troupe/tensor.hpp"
#include "troupe/work.hpp"

namespace troupe {

struct reducer_options {
  /// Cap of every bucket but the first reduced (c10d: bucket_cap_mb = 25).
  std::size_t bucket_cap_bytes = 25u * 1024 * 1024;
  /// Cap of the first bucket reduced, which holds the last parameters (c10d's
  /// _DEFAULT_FIRST_BUCKET_BYTES); at most bucket_cap_bytes.
  std::size_t first_bucket_bytes = 1024u * 1024;
  /// An explicit assignment instead: parameter indices per bucket, in the
  /// order buckets are reduced (every parameter exactly once, one dtype and
  /// device per bucket).
  std::vector<std::vector<std::size_t>> bucket_indices = {};
  /// The gradients live in the buckets: gradient(i) returns the gradient's
  /// view in its bucket (filled with the tensor passed at construction), the
  /// backward writes there, and nothing is copied in or out. Without it the
  /// caller's tensors are copied into the buckets when marked and the
  /// averages copied back by finish_step.
  bool gradient_as_bucket_view = false;
  /// Parameters may take no part in a step: mark_unused(i), or not marking i
  /// by finish_step, makes it contribute zeros; an allreduced used-bitmap
  /// tells finish_step which parameters no rank used, and those keep their
  /// gradients untouched.
  bool find_unused_parameters = false;
  /// The set of parameters used, and how often each is marked per step, is
  /// the same in every step. The first step records it (its buckets are
  /// reduced at finish_step, and its used-bitmap allreduced once); later steps
  /// mark the unused parameters ready by themselves, allow a parameter to be
  /// marked as often as in the first step (the last mark makes it ready), and
  /// need no used-bitmap.
  bool static_graph = false;
  /// After the first step, rebuild the buckets in the order gradients were
  /// marked ready on rank 0 (as c10d does after its first iteration), so that
  /// a backward that does not run in reverse parameter order still launches
  /// its first buckets early. Only without find_unused_parameters (or with
  /// static_graph) and without an explicit assignment; it costs one broadcast
  /// at the end of the first step. With gradient_as_bucket_view the
  /// gradients move into the new buckets: read gradient(i) again after a
  /// step that reports buckets_rebuilt.
  bool rebuild_buckets = true;
  /// One name per parameter for messages (optional).
  std::vector<std::string> parameter_names = {};
};

/// What finish_step reports.
struct step_report {
  /// Parameters that took no part in this step on this rank.
  std::vector<std::size_t> unused_parameters;
  /// Parameters no rank used (find_unused_parameters, static_graph); their
  /// gradients were left untouched (in bucket views: zero).
  std::vector<std::size_t> globally_unused_parameters;
  /// The buckets were rebuilt in the order of this (first) step's marks.
  bool buckets_rebuilt = false;
};

class reducer {
 public:
  /// A reducer over `pg` for the parameters whose gradients are `gradients`
  /// (contiguous, floating or complex, distinct). Collective.
  reducer(process_group& pg, tensor_list gradients, reducer_options options = {});
  ~reducer();
  reducer(const reducer&) = delete;
  reducer& operator=(const reducer&) = delete;

  /// Reduces buckets with `hook` instead of an averaging allreduce; once,
  /// before a step begins ("register_comm_hook can only be called once").
  void register_comm_hook(comm_hook hook);

  /// Where parameter i's gradient must be written: the tensor given at
  /// construction, or its bucket view with gradient_as_bucket_view.
  const tensor& gradient(std::size_t i) const;
  /// All of them, in parameter order.
  tensor_list gradients() const;
  /// Number of parameters.
  std::size_t size() const noexcept;

  /// Parameter i's gradient (gradient(i)) is final for this step. When its
  /// bucket is complete and every earlier bucket has been launched, the
  /// bucket's reduction starts, asynchronously. The first mark of a step
  /// begins the step. Marking twice fails with "Expected to mark a variable
  /// ready only once." (static_graph: more often than in the first step).
  void mark_ready(std::size_t i);
  /// As mark_ready(i), reading the gradient from `grad` (same dtype and
  /// numel; not copied when it is the bucket view).
  void mark_ready(std::size_t i, const tensor& grad);
  /// Parameter i takes no part in this step: it contributes zeros (needs
  /// find_unused_parameters or static_graph).
  void mark_unused(std::size_t i);

  /// Ends the step: waits for every bucket, writes the averaged gradients
  /// back (or leaves them in the bucket views) and reports the unused
  /// parameters. Without find_unused_parameters, every parameter must have
  /// been marked: otherwise it throws errc::invalid_argument naming those
  /// that were not, and the step stays open (mark them, then call again). A
  /// failed bucket fails the step with the bucket's error.
  step_report finish_step();

  // -- introspection ------------------------------------------------------------
  /// Number of buckets.
  std::size_t bucket_count() const noexcept;
  /// Parameter indices of each bucket, in buffer order; buckets in reduction order.
  const std::vector<std::vector<std::size_t>>& bucket_indices() const noexcept;
  /// The size limit each bucket was filled against (bytes; explicit
  /// assignments: the bucket's size).
  const std::vector<std::size_t>& bucket_size_limits() const noexcept;
  /// Bucket b's flat buffer.
  tensor bucket_buffer(std::size_t b) const;
  /// Bucket b's work in the current (or last) step; invalid before it launched.
  work bucket_work(std::size_t b) const;
  /// Steps finished so far.
  std::uint64_t steps() const;

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

}  // namespace troupe
