#pragma once
// Internal helpers shared by tensor.cpp, dlpack.cpp and other library sources.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/tensor.hpp"

namespace troupe::detail {

/// "[2, 3]".
std::string format_shape(const shape_t& shape);
/// Product of `shape`; throws errc::invalid_argument naming `op` for a negative
/// dimension or an overflowing product.
std::int64_t checked_numel(const char* op, const shape_t& shape);
/// Row-major strides (in elements) of a contiguous tensor of `shape`.
shape_t contiguous_strides(const shape_t& shape);
/// A base pointer for tensor storage that shares ownership with `owner` and
/// points at `data`, or at a private sentinel when `data` is null (only valid
/// for zero-element tensors), so that the tensor is still defined().
/// Owned host memory of `bytes` (64-byte aligned; large buffers use huge pages).
std::shared_ptr<void> allocate_host(std::size_t bytes);
std::shared_ptr<void> non_null_base(std::shared_ptr<void> owner, void* data);
/// Host memory of tensor::empty_shared: `bytes` in a memfd mapped here.
std::shared_ptr<void> allocate_shared(std::size_t bytes);
/// Where a range of tensor::empty_shared memory lives: the memfd `fd` of this
/// process (mapped whole, `size` bytes), allocation number `id` (never
/// reused), and the range's `offset` in it.
struct shared_range {
  int fd = -1;
  std::uint64_t id = 0;
  std::uint64_t size = 0;
  std::uint64_t offset = 0;
};
/// The shared allocation that holds all of [p, p + bytes), if any.
std::optional<shared_range> find_shared(const void* p, std::size_t bytes);
/// Moves a host allocation of tensor::empty (64 KiB or more: a mapping of its
/// own, pooled below 2 MiB) that is exactly [p, p + bytes) into shared
/// memory in place: its pages become a memfd's,
/// mapped at the same address with the same contents, so that ranks in
/// other processes can map it (as tensor::empty_shared memory). Only from
/// the second call for the allocation on (the first is counted). Empty when
/// the range is not such an allocation, on the first call, when it fails
/// (the buffer stays private and intact), when moved allocations hold 256
/// descriptors or a quarter of RLIMIT_NOFILE, or with TROUPE_SHARE_IN_PLACE=off.
/// A pooled buffer stays shared when it is handed out again.
std::optional<shared_range> share_in_place(const void* p, std::size_t bytes);
/// Elements per rank of alltoall_single's `splits` (counted in rows of `t`'s
/// first dimension); empty splits: `t` in `size` equal parts.
std::vector<std::int64_t> split_elements(const tensor& t, const std::vector<std::int64_t>& splits,
                                         int size);

}  // namespace troupe::detail
