#pragma once
// CPU reduction kernels: element-wise combination of buffers by a reduce_op kind.
//
// Buffers are raw element arrays of dtype `t` and length `n` (elements). They
// must not partially overlap; where noted a destination may equal a source.
// Integer SUM/PRODUCT wrap around; float16/bfloat16 combine in float32.
// Unsupported (kind, dtype) pairs throw errc::invalid_argument.

#include <cstddef>

#include "troupe/dtype.hpp"
#include "troupe/reduce_op.hpp"

namespace troupe::detail {

/// dst[i] = dst[i] op src[i]. AVG and PREMUL_SUM combine as SUM (the caller
/// scales). bool: SUM/MAX/BOR = or, PRODUCT/MIN/BAND = and, BXOR = xor.
/// Floating MIN/MAX propagate NaN.
void reduce_into(dtype t, reduce_op::kind op, void* dst, const void* src, std::size_t n);

/// dst = srcs[0] op srcs[1] op ... op srcs[nsrc-1], divided by `divisor`
/// when it is not 0 (AVG; floating and complex dtypes). `dst` may equal any
/// source. float16/bfloat16 accumulate the whole chain (and divide) in
/// float32 and round once. With nsrc == 1 (and no divisor), dst is a byte
/// copy of srcs[0]; with nsrc == 0, dst is left unchanged.
void reduce_many(dtype t, reduce_op::kind op, void* dst, const void* const* srcs, std::size_t nsrc,
                 std::size_t n, double divisor = 0);

/// data[i] *= factor (floating and complex dtypes only; PREMUL_SUM).
void scale_by(dtype t, void* data, std::size_t n, double factor);

/// data[i] /= divisor (floating and complex dtypes only; AVG).
void divide_by(dtype t, void* data, std::size_t n, double divisor);

/// Whether `t` is float16 or bfloat16 (sums travel as float32 between ranks).
bool is_half(dtype t) noexcept;
/// dst[i] = float(src[i]) for float16/bfloat16 `t` (kernels/half_convert.cpp).
void widen_to_float(dtype t, const void* src, float* dst, std::size_t n);
/// dst[i] = src[i] rounded once to float16/bfloat16 `t` (round to nearest even).
void narrow_from_float(dtype t, const float* src, void* dst, std::size_t n);

}  // namespace troupe::detail
