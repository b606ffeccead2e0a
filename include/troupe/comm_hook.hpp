#pragma once
/// Communication hooks: how the reducer reduces one bucket of gradients
/// (c10d's DDP comm hooks). A hook receives a grad_bucket and returns a work
/// whose result()[0] is the reduced buffer; it may chain continuations with
/// work::then, compress, or run several collectives.
///
///   // c10d's simple test hook: every gradient becomes 2
///   comm_hook twos{[](const grad_bucket& b) {
///     auto ones = ...;  // a tensor like b.buffer() filled with 1
///     return work::completed("ones", "", {ones}).then([](const work& w) {
///       auto t = w.result()[0];  // add 1 to every element
///       ...
///       return tensor_list{t};
///     });
///   }};
///   reducer.register_comm_hook(twos);
///
/// Built-in hooks: troupe/default_hooks.hpp (allreduce, fp16 and bf16
/// compression) and troupe/powersgd.hpp.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "troupe/tensor.hpp"
#include "troupe/work.hpp"

namespace troupe {

/// One bucket: the gradients of some parameters back to back in a flat buffer.
class grad_bucket {
 public:
  /// errc::invalid_argument when offsets and shapes do not fit the buffer.
  grad_bucket(std::size_t index, std::size_t bucket_count, tensor buffer,
              std::vector<std::size_t> parameter_indices, std::vector<std::int64_t> offsets,
              std::vector<shape_t> shapes);

  /// The bucket's index; buckets are reduced in index order.
  std::size_t index() const noexcept { return index_; }
  /// Whether this is the step's last bucket (state that advances once per
  /// step, as PowerSGD's iteration count, advances on it).
  bool is_last() const noexcept { return index_ + 1 == count_; }
  /// The flat buffer (one dtype and device).
  const tensor& buffer() const noexcept { return buffer_; }
  /// The parameters whose gradients the buffer holds, in buffer order.
  const std::vector<std::size_t>& parameter_indices() const noexcept { return params_; }
  /// Where each gradient starts in the buffer, in elements.
  const std::vector<std::int64_t>& offsets() const noexcept { return offsets_; }
  /// Each gradient's shape.
  const std::vector<shape_t>& shapes() const noexcept { return shapes_; }
  /// Views of the buffer, one per gradient, shaped.
  tensor_list gradients() const;

 private:
  std::size_t index_;
  std::size_t count_;
  tensor buffer_;
  std::vector<std::size_t> params_;
  std::vector<std::int64_t> offsets_;
  std::vector<shape_t> shapes_;
};

/// When the reducer hands buckets to a hook. Every rank must issue the same
/// collectives in the same order on a group; a hook that issues a collective
/// from a continuation (after an earlier one completed) does so at a moment
/// that differs between ranks.
enum class hook_ordering {
  /// Bucket b goes to the hook once bucket b-1's work completed, so the
  /// hook's collectives of one bucket all come before the next bucket's, on
  /// every rank. Right for any hook; needed by hooks that issue collectives
  /// from continuations (PowerSGD). Such a hook's group must carry nothing
  /// else while a step's buckets are in flight (give it a group of its own
  /// when the backward runs other collectives, e.g. SyncBatchNorm's).
  serial,
  /// Buckets go to the hook as soon as they are ready (in index order, on the
  /// thread that made them ready), so their reductions overlap. Only for
  /// hooks that issue all their collectives before they return (allreduce,
  /// fp16/bf16 compression).
  concurrent,
};

/// A communication hook.
struct comm_hook {
  /// Starts the reduction of a bucket and returns without blocking. The
  /// work's result()[0] is the reduced buffer: the bucket's buffer itself, or
  /// a tensor of its dtype and numel that the reducer copies into the bucket.
  std::function<work(const grad_bucket&)> run;
  /// serial unless the hook is known to issue everything before it returns.
  hook_ordering ordering = hook_ordering::serial;
  /// Named in errors.
  std::string name = "custom";
};

}  // namespace troupe
