// float16/bfloat16 <-> float32 conversions for sums that travel in float32
// between ranks (a partial sum rounded to half precision at every hop would
// differ from the float32 sum rounded once).

#include <cstdint>
#include <cstring>

#include "base/half.hpp"
#include "kernels/reduce_kernels.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

bool is_half(dtype t) noexcept {
  return t == dtype::float16 || t == dtype::bfloat16;
}

void widen_to_float(dtype t, const void* src, float* dst, std::size_t n) {
  const auto* in = static_cast<const std::uint16_t*>(src);
  if (t == dtype::float16)
    for (std::size_t i = 0; i < n; ++i) dst[i] = half_bits_to_float(in[i]);
  else if (t == dtype::bfloat16)
    for (std::size_t i = 0; i < n; ++i) dst[i] = bfloat16_bits_to_float(in[i]);
  else
    throw error(errc::internal, "widen_to_float: not a half-precision dtype");
}

void narrow_from_float(dtype t, const float* src, void* dst, std::size_t n) {
  auto* out = static_cast<std::uint16_t*>(dst);
  if (t == dtype::float16)
    for (std::size_t i = 0; i < n; ++i) out[i] = float_to_half_bits(src[i]);
  else if (t == dtype::bfloat16)
    for (std::size_t i = 0; i < n; ++i) out[i] = float_to_bfloat16_bits(src[i]);
  else
    throw error(errc::internal, "narrow_from_float: not a half-precision dtype");
}

}  // namespace troupe::detail
