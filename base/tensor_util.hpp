#pragma once
// Internal helpers shared by tensor.cpp, dlpack.cpp and other library sources.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memory/host_memory.hpp"
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
std::shared_ptr<void> non_null_base(std::shared_ptr<void> owner, void* data);
/// Elements per rank of alltoall_single's `splits` (counted in rows of `t`'s
/// first dimension); empty splits: `t` in `size` equal parts.
std::vector<std::int64_t> split_elements(const tensor& t, const std::vector<std::int64_t>& splits,
                                         int size);

/// What the library reads of tensors beyond their public face.
struct tensor_access {
  /// Both views keep the same storage alive (slices of one tensor do).
  static bool same_storage(const tensor& a, const tensor& b) noexcept {
    return !a.base_.owner_before(b.base_) && !b.base_.owner_before(a.base_);
  }
  /// A flat view of `n` elements of `first`'s storage from `first`'s first
  /// element on, sharing its ownership. The caller knows the storage holds
  /// them (the views of one tensor that lie one after another do).
  static tensor widened(const tensor& first, std::int64_t n) {
    auto r = first;
    set_flat(r, n);
    return r;
  }
  /// A flat view of the bytes of `t` (defined, contiguous) read as `to`,
  /// sharing its ownership: uint8 for its raw bytes, float32 for a
  /// complex64 tensor's real and imaginary parts. `t`'s bytes must be a
  /// whole number of `to`'s elements.
  static tensor reinterpreted(const tensor& t, dtype to) {
    auto r = t;
    r.dtype_ = to;
    set_flat(r, static_cast<std::int64_t>(t.nbytes() / troupe::element_size(to)));
    return r;
  }
  /// Gives `t` the layout of `n` elements in one dimension. The last few
  /// such layouts a thread made are shared by the views it makes of the same
  /// length (calls that view their tensors flat allocate nothing then).
  static void set_flat(tensor& t, std::int64_t n);
};

}  // namespace troupe::detail
