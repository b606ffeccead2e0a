#pragma once
// Flat buffers: how the backends see the caller's tensors (one dimension),
// and several tensors packed into one buffer and unpacked again.

#include <cstddef>
#include <cstdint>

#include "base/tensor_util.hpp"
#include "troupe/tensor.hpp"

namespace troupe::detail {

/// Whether `t` is defined and one contiguous dimension: flat(t) is t itself.
inline bool is_flat(const tensor& t) {
  return t.defined() && t.dim() == 1 && t.is_contiguous();
}

/// `t` as one dimension (undefined stays undefined).
inline tensor flat(const tensor& t) {
  if (!t.defined() || is_flat(t)) return t;  // a copy shares its layout
  return t.view({t.numel()});
}

/// flat(t) without a copy of `t` where it is flat already (or undefined):
/// `t` itself, else the view, kept in `view`.
inline const tensor& flat_ref(const tensor& t, tensor& view) {
  if (!t.defined() || is_flat(t)) return t;
  view = t.view({t.numel()});
  return view;
}

/// A new flat buffer of `n` elements of `t`'s dtype on `t`'s device.
inline tensor like(const tensor& t, std::int64_t n) {
  return tensor::empty({n}, t.scalar_type(), t.get_device());
}

inline bool on_cuda(const tensor& t) {
  return t.defined() && t.get_device().type == device_type::cuda;
}

/// No tensor, or one in host memory.
inline bool on_cpu_or_none(const tensor& t) {
  return !t.defined() || t.get_device().type == device_type::cpu;
}

inline std::int64_t total_numel(const tensor_list& ts) {
  std::int64_t n = 0;
  for (auto& t : ts) n += t.numel();
  return n;
}

/// The tensors as one flat buffer when they already lie one after another in
/// memory (each contiguous and not empty, same dtype and device, each
/// starting where the one before ends, as the views of one tensor a caller
/// splits into per-rank blocks do): a view over them that keeps them alive,
/// so that a call reads or writes them in place instead of packing them into
/// a buffer of its own and copying back. Undefined otherwise. Views of one
/// storage (a tensor split into blocks) give a view of that storage; others
/// (adjacent pieces of memory owned apart) one that keeps the list alive.
inline tensor adjacent(const tensor_list& ts) {
  if (ts.empty()) return {};
  if (ts.size() == 1) return ts[0].is_contiguous() ? flat(ts[0]) : tensor{};
  std::int64_t n = 0;
  const auto* next = static_cast<const std::byte*>(ts.front().data());
  bool one_storage = true;
  for (auto& t : ts) {
    if (!t.defined() || t.numel() == 0 || !t.is_contiguous() ||
        t.scalar_type() != ts.front().scalar_type() ||
        !(t.get_device() == ts.front().get_device()) ||
        static_cast<const std::byte*>(t.data()) != next)
      return {};
    next += t.nbytes();
    n += t.numel();
    one_storage = one_storage && tensor_access::same_storage(t, ts.front());
  }
  if (one_storage) return tensor_access::widened(ts.front(), n);
  return tensor::adopt(
      ts.front().data(), {n}, ts.front().scalar_type(), [keep = ts](void*) {},
      ts.front().get_device());
}

/// Copies the tensors one after another into a new flat buffer.
inline tensor pack(const tensor_list& ts) {
  auto buf = like(ts.front(), total_numel(ts));
  std::int64_t off = 0;
  for (auto& t : ts) {
    buf.flat_slice(off, t.numel()).copy_from(flat(t));
    off += t.numel();
  }
  return buf;
}

/// Copies consecutive parts of `buf`, starting at `off`, into the tensors.
inline std::int64_t unpack(const tensor& buf, std::int64_t off, const tensor_list& ts) {
  for (auto& t : ts) {
    flat(t).copy_from(buf.flat_slice(off, t.numel()));
    off += t.numel();
  }
  return off;
}

}  // namespace troupe::detail
