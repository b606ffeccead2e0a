#pragma once
// float32 <-> float16 / bfloat16 over whole buffers, with AVX2 and F16C
// where the CPU has them (chosen at run time) and the portable conversions
// of base/half.hpp otherwise. Round to nearest even, NaN stays NaN.

#include <cstdint>

namespace troupe::detail {

/// d[i] = half(s[i] * scale).
void float_to_half(const float* s, std::uint16_t* d, std::int64_t n, float scale);
/// d[i] = float(s[i]).
void half_to_float(const std::uint16_t* s, float* d, std::int64_t n);
/// d[i] = bfloat16(s[i] * scale).
void float_to_bfloat16(const float* s, std::uint16_t* d, std::int64_t n, float scale);
/// d[i] = float(s[i]).
void bfloat16_to_float(const std::uint16_t* s, float* d, std::int64_t n);

}  // namespace troupe::detail
