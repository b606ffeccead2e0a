#pragma once
// Element-wise arithmetic the training layer needs on host tensors (casts,
// scaling, sums and differences). Tensors on a device are staged through
// host memory.

#include <cstdint>
#include <string>

#include "troupe/tensor.hpp"

namespace troupe::detail {

/// Whether the training layer can compute on `t`: float16, bfloat16, float32 or float64.
bool is_training_float(dtype t) noexcept;

/// dst = src * scale, converting between floating dtypes (same numel, both
/// contiguous). `op` names the caller in errors.
void cast_scaled(const char* op, tensor dst, const tensor& src, double scale = 1.0);
/// A new host tensor of `to` with src's shape and values (times `scale`).
tensor cast_copy(const char* op, const tensor& src, dtype to, double scale = 1.0);
/// t *= scale (floating or complex).
void scale_inplace(const char* op, tensor t, double scale);
/// dst += src (same dtype and numel, floating).
void add_inplace(const char* op, tensor dst, const tensor& src);
/// dst = a - b (same dtype and numel, floating).
void subtract_into(const char* op, tensor dst, const tensor& a, const tensor& b);
/// A tensor of `t`'s shape, dtype and device filled with zeros.
tensor zeros_like(const tensor& t);

/// "[2, 3]" (Python's list notation, as the seeds print shapes).
std::string shape_string(const shape_t& shape);

}  // namespace troupe::detail
