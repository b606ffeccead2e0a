#pragma once
// Branch-free float16 / bfloat16 <-> float conversions (round to nearest even),
// shared by dtype.cpp and the reduction kernels. Written with selects instead of
// branches so that loops over them can be vectorised.

#include <bit>
#include <cstdint>

namespace troupe::detail {

/// IEEE binary16 bits -> float (exact; subnormals, Inf and NaN preserved).
inline float half_bits_to_float(std::uint16_t h) noexcept {
  constexpr std::uint32_t exp_mask = 0x7c00u << 13;  // half exponent, shifted to float position
  const std::uint32_t magnitude = (static_cast<std::uint32_t>(h) & 0x7fffu) << 13;
  const std::uint32_t exponent = magnitude & exp_mask;
  // Rebias the exponent; Inf/NaN (all exponent bits set) get the rest of the float range.
  const std::uint32_t inf_nan = 0u - static_cast<std::uint32_t>(exponent == exp_mask);
  const std::uint32_t normal = magnitude + ((127u - 15u) << 23) + (inf_nan & ((128u - 16u) << 23));
  // Subnormal half: give it the smallest normal exponent, then subtract that implicit one.
  const float sub = std::bit_cast<float>(normal + (1u << 23)) - std::bit_cast<float>(113u << 23);
  const std::uint32_t is_sub = 0u - static_cast<std::uint32_t>(exponent == 0);
  const std::uint32_t bits = (is_sub & std::bit_cast<std::uint32_t>(sub)) | (~is_sub & normal);
  return std::bit_cast<float>(bits | (static_cast<std::uint32_t>(h) & 0x8000u) << 16);
}

/// float -> IEEE binary16 bits, rounding to nearest even; overflow gives Inf,
/// NaN stays NaN (quiet, keeping the top payload bits).
inline std::uint16_t float_to_half_bits(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7fffffffu;
  // Inf or NaN, or a finite value of at least 2^16 (always rounds to Inf).
  const std::uint32_t is_nan = 0u - static_cast<std::uint32_t>(a > 0x7f800000u);
  const std::uint32_t special = 0x7c00u | (is_nan & (0x200u | ((a >> 13) & 0x3ffu)));
  // Subnormal or zero result: adding 0.5f aligns the 10 mantissa bits at the
  // bottom of the float and the FPU rounds to nearest even.
  constexpr std::uint32_t magic = 126u << 23;
  const std::uint32_t sub =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(a) + std::bit_cast<float>(magic)) - magic;
  // Normal result: rebias, then round to nearest even by adding 0xfff plus the
  // lowest kept bit (a carry into the exponent is the correct result, Inf included).
  const std::uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  const std::uint32_t is_special = 0u - static_cast<std::uint32_t>(a >= 0x47800000u);
  const std::uint32_t is_sub = 0u - static_cast<std::uint32_t>(a < 0x38800000u);
  const std::uint32_t r =
      (is_special & special) | (is_sub & sub) | (~(is_special | is_sub) & normal);
  return static_cast<std::uint16_t>(r | sign);
}

/// bfloat16 bits -> float (exact).
inline float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

/// float -> bfloat16 bits, rounding to nearest even; NaN stays NaN (quiet).
inline std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (x >> 16) | 0x40u;
  return static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

}  // namespace troupe::detail
