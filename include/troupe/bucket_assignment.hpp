#pragma once
/// Gradient bucketing: which tensors share a flat buffer that is reduced in
/// one call (c10d's compute_bucket_assignment_by_size).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "troupe/tensor.hpp"

namespace troupe {

/// Buckets of tensor indices and the size limit each bucket was built under.
struct bucket_assignment {
  /// Tensor indices per bucket, in the order the tensors were added.
  std::vector<std::vector<std::size_t>> buckets;
  /// The size limit (bytes) each bucket was filled against; 0 for a bucket of
  /// its own (an expected sparse gradient).
  std::vector<std::size_t> size_limits;
};

/// Groups `tensors` into buckets by size, as c10d does:
///
/// - one open bucket per (dtype, device); a tensor joins the open bucket of its
///   key, and the bucket closes once its bytes reach the key's current limit
///   (so a bucket may exceed its limit by its last tensor);
/// - each key starts at `size_limits[0]` and moves to the next limit each time
///   one of its buckets closes; the last limit repeats;
/// - a tensor whose `expect_sparse[index]` is true gets a bucket of its own
///   (limit 0);
/// - buckets still open at the end follow, in the order of their first tensors.
///
/// Without `tensor_indices`, tensors[i] has index i and the buckets come out
/// sorted by the smallest index they hold. With them, tensors[i] has index
/// tensor_indices[i] (the order in which gradients become ready, as when c10d
/// rebuilds its buckets) and the buckets stay in the order they were filled.
/// errc::invalid_argument for no tensors, no limits, a zero limit, or
/// expect_sparse / tensor_indices that do not fit the tensors.
bucket_assignment compute_bucket_assignment_by_size(
    const tensor_list& tensors, const std::vector<std::size_t>& size_limits,
    const std::vector<bool>& expect_sparse = {},
    const std::vector<std::int64_t>& tensor_indices = {});

}  // namespace troupe
