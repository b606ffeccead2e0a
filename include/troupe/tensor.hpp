#pragma once
/// troupe::tensor — a strided view over memory that it owns or borrows.
///
/// A tensor is a cheap handle (like torch::Tensor): copies share the same
/// memory. It knows its shape, strides, dtype and device. Collectives accept
/// only contiguous tensors; strided ones exist so that what a user hands in
/// (through from_blob or DLPack) is represented faithfully and rejected with a
/// clear error instead of silently copied.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "troupe/device.hpp"
#include "troupe/dtype.hpp"

struct DLManagedTensor;  // from <dlpack/dlpack.h>; only pointers cross this header

namespace troupe {

namespace detail {
struct tensor_access;  // the library's views across tensors (base/tensor_util.hpp)
}

using shape_t = std::vector<std::int64_t>;

class tensor {
 public:
  /// An undefined tensor (defined() == false).
  tensor() = default;

  /// Allocates uninitialised memory owned by the tensor (on a CUDA device:
  /// device memory; errc::backend when the device is not usable).
  ///
  /// Host tensors of 64 KiB and more get a mapping of their own (from 2 MiB
  /// with huge pages where the system allows; smaller ones are kept for
  /// reuse when freed). The second allreduce between processes of one host
  /// that uses such a tensor whole moves its pages into shared memory in
  /// place (same address, same contents; as MPI libraries register reused
  /// user buffers), so that this and later collectives read the peers'
  /// buffers directly instead of staging every byte. The memory then
  /// behaves as empty_shared's: a child forked later shares a live tensor's
  /// buffer rather than copying it (and drops such buffers that wait in the
  /// pool for reuse). Each such buffer holds a file descriptor (at most 256,
  /// and a quarter of the process's limit). Set TROUPE_SHARE_IN_PLACE=off to
  /// keep such tensors private.
  static tensor empty(shape_t shape, dtype t, device d = device::cpu());
  /// Allocates uninitialised host memory that ranks in other processes of this
  /// host can map (like MPI_Alloc_mem): an allreduce between processes on
  /// such tensors reduces straight from the ranks' buffers instead of staging
  /// through shared slots. Its pages fault in one by one (a fresh 16 MiB
  /// tensor costs several milliseconds more than empty()), so keep and reuse
  /// such tensors, as gradient buckets are.
  static tensor empty_shared(shape_t shape, dtype t);
  /// Allocates zero-filled memory owned by the tensor.
  static tensor zeros(shape_t shape, dtype t, device d = device::cpu());
  /// Borrows `data` (not freed by troupe). Contiguous strides.
  static tensor from_blob(void* data, shape_t shape, dtype t, device d = device::cpu());
  /// Borrows `data` with explicit strides (in elements).
  static tensor from_blob(void* data, shape_t shape, shape_t strides, dtype t,
                          device d = device::cpu());
  /// Adopts `data`: `deleter(data)` runs when the last handle goes away.
  static tensor adopt(void* data, shape_t shape, dtype t, std::function<void(void*)> deleter,
                      device d = device::cpu());
  /// Copies `values` into a new one-dimensional owned tensor.
  template <class T>
  static tensor from_vector(const std::vector<T>& values) {
    auto r = empty({static_cast<std::int64_t>(values.size())}, dtype_of<T>);
    if constexpr (std::is_same_v<T, bool>) {  // std::vector<bool> packs its bits
      const std::vector<std::uint8_t> bytes(values.begin(), values.end());
      copy_bytes(r.data(), bytes.data(), bytes.size());
    } else {
      copy_bytes(r.data(), values.data(), values.size() * sizeof(T));
    }
    return r;
  }
  template <class T>
  static tensor from_vector(std::initializer_list<T> values) {
    return from_vector(std::vector<T>(values));
  }

  /// Imports a DLPack tensor without copying; the tensor takes ownership of
  /// `managed` and calls its deleter when the last handle goes away.
  static tensor from_dlpack(DLManagedTensor* managed);
  /// Exports without copying. The returned tensor keeps this memory alive until
  /// the consumer calls its deleter.
  DLManagedTensor* to_dlpack() const;

  bool defined() const noexcept { return static_cast<bool>(base_); }
  dtype scalar_type() const noexcept { return dtype_; }
  const device& get_device() const noexcept { return device_; }
  bool is_cpu() const noexcept { return device_.type == device_type::cpu; }
  const shape_t& shape() const noexcept { return layout_ ? layout_->shape : no_dims(); }
  const shape_t& strides() const noexcept { return layout_ ? layout_->strides : no_dims(); }
  std::int64_t dim() const noexcept { return static_cast<std::int64_t>(shape().size()); }
  std::int64_t numel() const noexcept { return !defined() ? 0 : layout_ ? layout_->numel : 1; }
  std::size_t element_size() const noexcept;
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(numel()) * element_size(); }
  bool is_contiguous() const noexcept { return !layout_ || layout_->contiguous; }

  /// Address of the first element.
  void* data() const noexcept;
  template <class T>
  T* data_as() const noexcept {
    return static_cast<T*>(data());
  }

  /// A new owned contiguous tensor with the same contents.
  tensor clone() const;
  /// Copies `src` (same dtype and numel, both contiguous) into this tensor,
  /// between any devices; returns once the copy is complete.
  void copy_from(const tensor& src);
  /// Fills every element with zero bytes.
  void zero_();
  /// A view of `count` elements starting at flat element `offset` (contiguous only).
  tensor flat_slice(std::int64_t offset, std::int64_t count) const;
  /// A view with a new shape of the same numel (contiguous only).
  tensor view(shape_t shape) const;
  /// Whether both tensors start at the same address with the same size.
  bool is_same(const tensor& other) const noexcept;

  /// Copies the contents (contiguous, any device) into a vector of T (dtype must match).
  template <class T>
  std::vector<T> to_vector() const {
    check_element_type(dtype_of<T>);
    if constexpr (std::is_same_v<T, bool>) {  // std::vector<bool> packs its bits
      std::vector<std::uint8_t> bytes(static_cast<std::size_t>(numel()));
      read_into(bytes.data(), bytes.size());
      return std::vector<bool>(bytes.begin(), bytes.end());
    } else {
      std::vector<T> r(static_cast<std::size_t>(numel()));
      read_into(r.data(), r.size() * sizeof(T));
      return r;
    }
  }

  /// "tensor(float32, cpu, [2, 3])".
  std::string describe() const;

 private:
  friend struct detail::tensor_access;
  static tensor make(std::shared_ptr<void> base, std::size_t offset, shape_t shape, shape_t strides,
                     dtype t, device d);
  static void copy_bytes(void* dst, const void* src, std::size_t n);
  void read_into(void* host, std::size_t n) const;
  void check_element_type(dtype t) const;

  /// Shape and strides, immutable and shared by a tensor's copies (copying a
  /// tensor then allocates nothing; calls hand tensors down several layers).
  struct layout {
    shape_t shape;
    shape_t strides;
    std::int64_t numel;  ///< the product of shape (asked several times per call)
    bool contiguous;     ///< row-major without gaps (likewise)
  };
  static const shape_t& no_dims() noexcept;
  void set_layout(shape_t shape, shape_t strides);

  std::shared_ptr<void> base_;  // keeps the memory alive (owned, borrowed or DLPack)
  std::size_t offset_ = 0;      // bytes from base_ to the first element
  std::shared_ptr<const layout> layout_;
  dtype dtype_ = dtype::float32;
  device device_;
};

using tensor_list = std::vector<tensor>;

}  // namespace troupe
