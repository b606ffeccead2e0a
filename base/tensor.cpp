// troupe::tensor: owned, borrowed and adopted memory; views, copies, errors.
// Where owned host memory comes from: memory/host_memory.cpp.

#include "troupe/tensor.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "base/texts.hpp"
#include "memory/device_memory.hpp"
#include "tensor_util.hpp"
#include "troupe/error.hpp"

namespace troupe {
namespace detail {

std::string format_shape(const shape_t& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::int64_t checked_numel(const char* op, const shape_t& shape) {
  std::int64_t n = 1;
  for (auto d : shape) {
    if (d < 0)
      throw error(errc::invalid_argument, std::string(op) + ": negative dimension " +
                                              std::to_string(d) + " in shape " +
                                              format_shape(shape));
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d)
      throw error(errc::invalid_argument,
                  std::string(op) + ": shape " + format_shape(shape) + " has too many elements");
    n *= d;
  }
  return n;
}

shape_t contiguous_strides(const shape_t& shape) {
  shape_t strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i] > 0 ? shape[i] : 1;
  }
  return strides;
}

namespace {

// Stands in for the address of zero-element tensors whose memory pointer is null,
// so that such tensors are still defined().
alignas(64) unsigned char empty_sentinel[64];

// Calls `f(byte_offset)` for every element in row-major order.
template <class F>
void for_each_offset(const shape_t& shape, const shape_t& strides, std::size_t elem, F&& f) {
  const std::size_t nd = shape.size();
  std::vector<std::int64_t> index(nd, 0);
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  std::int64_t off = 0;  // in elements
  for (std::int64_t k = 0; k < n; ++k) {
    f(off * static_cast<std::int64_t>(elem));
    for (std::size_t i = nd; i-- > 0;) {
      if (++index[i] < shape[i]) {
        off += strides[i];
        break;
      }
      off -= strides[i] * (shape[i] - 1);
      index[i] = 0;
    }
  }
}

}  // namespace

std::vector<std::int64_t> split_elements(const tensor& t, const std::vector<std::int64_t>& splits,
                                         int size) {
  const auto numel = t.numel();
  const auto rows = t.dim() == 0 ? 1 : t.shape()[0];
  const auto row = rows == 0 ? 0 : numel / rows;
  std::vector<std::int64_t> r(static_cast<std::size_t>(size));
  for (std::size_t p = 0; p < r.size(); ++p) r[p] = splits.empty() ? numel / size : splits[p] * row;
  return r;
}

std::shared_ptr<void> non_null_base(std::shared_ptr<void> owner, void* data) {
  return std::shared_ptr<void>(std::move(owner), data ? data : empty_sentinel);
}

}  // namespace detail

namespace {

void check_data(const char* op, const void* data, std::int64_t numel) {
  if (!data && numel > 0)
    detail::throw_invalid(op, "null data pointer for " + std::to_string(numel) + " elements");
}

}  // namespace

const shape_t& tensor::no_dims() noexcept {
  static const shape_t none;
  return none;
}

void tensor::set_layout(shape_t shape, shape_t strides) {
  std::int64_t numel = 1;
  for (auto d : shape) numel *= d;
  // Row-major without gaps, from the innermost dimension out (a dimension
  // of 0 ends the look: no elements beyond it; one of 1 has any stride).
  bool contiguous = true;
  std::int64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 0) break;
    if (shape[i] == 1) continue;
    if (strides[i] != expected) {
      contiguous = false;
      break;
    }
    expected *= shape[i];
  }
  layout_ = std::make_shared<const layout>(
      layout{std::move(shape), std::move(strides), numel, contiguous});
}

void detail::tensor_access::set_flat(tensor& t, std::int64_t n) {
  using layout = tensor::layout;
  struct recent {
    std::array<std::shared_ptr<const layout>, 4> layouts;
    std::size_t next = 0;
  };
  thread_local recent made;
  for (auto& l : made.layouts)
    if (l && l->numel == n) {
      t.layout_ = l;
      return;
    }
  auto l = std::make_shared<const layout>(layout{{n}, {1}, n, true});
  made.layouts[made.next++ % made.layouts.size()] = l;
  t.layout_ = std::move(l);
}

tensor tensor::make(std::shared_ptr<void> base, std::size_t offset, shape_t shape, shape_t strides,
                    dtype t, device d) {
  tensor r;
  r.base_ = std::move(base);
  r.offset_ = offset;
  r.set_layout(std::move(shape), std::move(strides));
  r.dtype_ = t;
  r.device_ = d;
  return r;
}

namespace {

/// Bytes of contiguous storage for `shape` of `t`, rounded up to whole cache
/// lines so that vectorised kernels may touch the tail; errors name `op`.
std::size_t storage_bytes(const char* op, const shape_t& shape, dtype t) {
  const auto n = detail::checked_numel(op, shape);
  const auto elem = troupe::element_size(t);
  if (static_cast<std::uint64_t>(n) > std::numeric_limits<std::size_t>::max() / 2 / elem)
    detail::throw_invalid(op, "shape " + detail::format_shape(shape) + " is too large");
  return (static_cast<std::size_t>(n) * elem + 63) / 64 * 64;
}

}  // namespace

tensor tensor::empty(shape_t shape, dtype t, device d) {
  const auto bytes = storage_bytes("tensor.empty", shape, t);
  std::shared_ptr<void> base = d.type == device_type::cpu
                                   ? detail::allocate_host(bytes)
                                   : detail::gpu::allocate("tensor.empty", d, bytes);
  if (shape.size() == 1) {
    // One dimension: a layout this thread made recently (set_flat), not a
    // new one with its two vectors (a third of a 4-byte tensor's cost).
    tensor r;
    r.base_ = std::move(base);
    r.dtype_ = t;
    r.device_ = d;
    detail::tensor_access::set_flat(r, shape[0]);
    return r;
  }
  auto strides = detail::contiguous_strides(shape);
  return make(std::move(base), 0, std::move(shape), std::move(strides), t, d);
}

tensor tensor::empty_shared(shape_t shape, dtype t) {
  auto base = detail::allocate_shared(storage_bytes("tensor.empty_shared", shape, t));
  auto strides = detail::contiguous_strides(shape);
  return make(std::move(base), 0, std::move(shape), std::move(strides), t, device::cpu());
}

tensor tensor::zeros(shape_t shape, dtype t, device d) {
  if (d.type != device_type::cpu) detail::gpu::check_device("tensor.zeros", d);
  auto r = empty(std::move(shape), t, d);
  if (d.type == device_type::cpu)
    std::memset(r.data(), 0, r.nbytes());
  else
    detail::gpu::zero("tensor.zeros", d, r.data(), r.nbytes());
  return r;
}

tensor tensor::from_blob(void* data, shape_t shape, dtype t, device d) {
  const auto n = detail::checked_numel("tensor.from_blob", shape);
  check_data("tensor.from_blob", data, n);
  auto strides = detail::contiguous_strides(shape);
  return make(detail::non_null_base(nullptr, data), 0, std::move(shape), std::move(strides), t, d);
}

tensor tensor::from_blob(void* data, shape_t shape, shape_t strides, dtype t, device d) {
  const auto n = detail::checked_numel("tensor.from_blob", shape);
  check_data("tensor.from_blob", data, n);
  if (strides.size() != shape.size())
    detail::throw_invalid("tensor.from_blob", "strides " + detail::format_shape(strides) +
                                                  " do not match shape " +
                                                  detail::format_shape(shape));
  return make(detail::non_null_base(nullptr, data), 0, std::move(shape), std::move(strides), t, d);
}

tensor tensor::adopt(void* data, shape_t shape, dtype t, std::function<void(void*)> deleter,
                     device d) {
  const auto n = detail::checked_numel("tensor.adopt", shape);
  check_data("tensor.adopt", data, n);
  std::shared_ptr<void> owner(data, [del = std::move(deleter)](void* p) {
    if (del) del(p);
  });
  auto strides = detail::contiguous_strides(shape);
  return make(detail::non_null_base(std::move(owner), data), 0, std::move(shape),
              std::move(strides), t, d);
}

std::size_t tensor::element_size() const noexcept {
  return troupe::element_size(dtype_);
}

void* tensor::data() const noexcept {
  if (!base_) return nullptr;
  return static_cast<char*>(base_.get()) + offset_;
}

tensor tensor::clone() const {
  if (!defined()) detail::throw_invalid("tensor.clone", "undefined tensor");
  if (!is_cpu() && !is_contiguous())
    detail::throw_invalid("tensor.clone", describe() + ": strided CUDA tensors cannot be cloned");
  auto r = empty(shape(), dtype_, device_);
  if (!is_cpu()) {
    detail::gpu::copy("tensor.clone", r.data(), data(), nbytes());
  } else if (is_contiguous()) {
    copy_bytes(r.data(), data(), nbytes());
  } else {
    auto* dst = static_cast<char*>(r.data());
    const auto* src = static_cast<const char*>(data());
    const auto elem = element_size();
    detail::for_each_offset(shape(), strides(), elem, [&](std::int64_t off) {
      std::memcpy(dst, src + off, elem);
      dst += elem;
    });
  }
  return r;
}

void tensor::copy_from(const tensor& src) {
  if (!defined() || !src.defined()) detail::throw_invalid("tensor.copy_from", "undefined tensor");
  if (src.dtype_ != dtype_)
    detail::throw_invalid("tensor.copy_from", "dtype mismatch " + std::string(to_string(dtype_)) +
                                                  " vs " + std::string(to_string(src.dtype_)));
  if (src.numel() != numel())
    detail::throw_invalid("tensor.copy_from", "numel mismatch " + std::to_string(numel()) + " vs " +
                                                  std::to_string(src.numel()));
  if (!is_contiguous())
    detail::throw_invalid("tensor.copy_from", "destination " + describe() + " is not contiguous");
  if (!src.is_contiguous())
    detail::throw_invalid("tensor.copy_from", "source " + src.describe() + " is not contiguous");
  if (data() == src.data()) return;
  if (is_cpu() && src.is_cpu())
    std::memmove(data(), src.data(), nbytes());
  else
    detail::gpu::copy("tensor.copy_from", data(), src.data(), nbytes());
}

void tensor::zero_() {
  if (!defined()) detail::throw_invalid("tensor.zero_", "undefined tensor");
  if (!is_cpu()) {
    if (!is_contiguous())
      detail::throw_invalid("tensor.zero_", describe() + ": strided CUDA tensors cannot be zeroed");
    detail::gpu::zero("tensor.zero_", device_, data(), nbytes());
    return;
  }
  if (is_contiguous()) {
    if (nbytes()) std::memset(data(), 0, nbytes());
    return;
  }
  auto* p = static_cast<char*>(data());
  const auto elem = element_size();
  detail::for_each_offset(shape(), strides(), elem,
                          [&](std::int64_t off) { std::memset(p + off, 0, elem); });
}

tensor tensor::flat_slice(std::int64_t offset, std::int64_t count) const {
  if (!defined()) detail::throw_invalid("tensor.flat_slice", "undefined tensor");
  if (!is_contiguous())
    detail::throw_invalid("tensor.flat_slice", describe() + " is not contiguous");
  const auto n = numel();
  if (offset < 0 || count < 0 || offset > n || count > n - offset)
    detail::throw_invalid("tensor.flat_slice", "range [" + std::to_string(offset) + ", " +
                                                   std::to_string(offset + count) + ") outside " +
                                                   std::to_string(n) + " elements");
  auto r = *this;
  r.offset_ += static_cast<std::size_t>(offset) * element_size();
  detail::tensor_access::set_flat(r, count);
  return r;
}

tensor tensor::view(shape_t shape) const {
  if (!defined()) detail::throw_invalid("tensor.view", "undefined tensor");
  if (!is_contiguous()) detail::throw_invalid("tensor.view", describe() + " is not contiguous");
  const auto n = numel();
  // One dimension may be -1: inferred from the others.
  int inferred = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && inferred < 0) {
      inferred = static_cast<int>(i);
    } else if (shape[i] < 0) {
      detail::throw_invalid("tensor.view", "invalid dimension " + std::to_string(shape[i]) +
                                               " in shape " + detail::format_shape(shape));
    } else {
      known *= shape[i];
    }
  }
  if (inferred >= 0) {
    if (known == 0 || n % known != 0)
      detail::throw_invalid("tensor.view", "shape " + detail::format_shape(shape) +
                                               " is invalid for " + std::to_string(n) +
                                               " elements");
    shape[static_cast<std::size_t>(inferred)] = n / known;
  }
  const auto m = detail::checked_numel("tensor.view", shape);
  if (m != n)
    detail::throw_invalid("tensor.view", "shape " + detail::format_shape(shape) + " has " +
                                             std::to_string(m) + " elements, tensor has " +
                                             std::to_string(n));
  auto r = *this;
  if (shape.size() == 1) {
    detail::tensor_access::set_flat(r, m);
    return r;
  }
  auto strides = detail::contiguous_strides(shape);
  r.set_layout(std::move(shape), std::move(strides));
  return r;
}

bool tensor::is_same(const tensor& other) const noexcept {
  if (defined() != other.defined()) return false;
  return data() == other.data() && nbytes() == other.nbytes();
}

std::string tensor::describe() const {
  if (!defined()) return "tensor(undefined)";
  std::string s = "tensor(" + std::string(to_string(dtype_)) + ", " + to_string(device_) + ", " +
                  detail::format_shape(shape());
  if (!is_contiguous()) s += ", strides " + detail::format_shape(strides());
  return s + ")";
}

void tensor::copy_bytes(void* dst, const void* src, std::size_t n) {
  if (n) std::memcpy(dst, src, n);
}

void tensor::check_element_type(dtype t) const {
  if (!defined()) detail::throw_invalid("tensor.to_vector", "undefined tensor");
  if (t != dtype_)
    detail::throw_invalid("tensor.to_vector", "dtype mismatch " + std::string(to_string(dtype_)) +
                                                  " vs " + std::string(to_string(t)));
  if (!is_contiguous())
    detail::throw_invalid("tensor.to_vector", describe() + " is not contiguous");
}

void tensor::read_into(void* host, std::size_t n) const {
  if (n == 0) return;
  if (is_cpu())
    copy_bytes(host, data(), n);
  else
    detail::gpu::copy("tensor.to_vector", host, data(), n);
}

}  // namespace troupe
