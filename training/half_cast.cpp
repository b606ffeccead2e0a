#include "training/half_cast.hpp"

#include <immintrin.h>

#include "base/half.hpp"

namespace troupe::detail {

namespace {

bool has_avx2_f16c() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return yes;
#else
  return false;
#endif
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2,f16c"))) void float_to_half_avx2(const float* s, std::uint16_t* d,
                                                             std::int64_t n, float scale) {
  const __m256 k = _mm256_set1_ps(scale);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + i), k);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) d[i] = float_to_half_bits(s[i] * scale);
}

__attribute__((target("avx2,f16c"))) void half_to_float_avx2(const std::uint16_t* s, float* d,
                                                             std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = half_bits_to_float(s[i]);
}

__attribute__((target("avx2"))) void float_to_bfloat16_avx2(const float* s, std::uint16_t* d,
                                                            std::int64_t n, float scale) {
  const __m256 k = _mm256_set1_ps(scale);
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_castps_si256(_mm256_mul_ps(_mm256_loadu_ps(s + i), k));
    // Round to nearest even: (x + 0x7fff + ((x >> 16) & 1)) >> 16; NaN: (x >> 16) | 0x40.
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, bias), lsb), 16);
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), quiet);
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
    // 8 x 32 bits -> 8 x 16 bits (values fit: no saturation), lanes back in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; ++i) d[i] = float_to_bfloat16_bits(s[i] * scale);
}

__attribute__((target("avx2"))) void bfloat16_to_float_avx2(const std::uint16_t* s, float* d,
                                                            std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)));
  }
  for (; i < n; ++i) d[i] = bfloat16_bits_to_float(s[i]);
}
#endif

}  // namespace

void float_to_half(const float* s, std::uint16_t* d, std::int64_t n, float scale) {
#if defined(__x86_64__) || defined(__i386__)
  if (has_avx2_f16c()) return float_to_half_avx2(s, d, n, scale);
#endif
  for (std::int64_t i = 0; i < n; ++i) d[i] = float_to_half_bits(s[i] * scale);
}

void half_to_float(const std::uint16_t* s, float* d, std::int64_t n) {
#if defined(__x86_64__) || defined(__i386__)
  if (has_avx2_f16c()) return half_to_float_avx2(s, d, n);
#endif
  for (std::int64_t i = 0; i < n; ++i) d[i] = half_bits_to_float(s[i]);
}

void float_to_bfloat16(const float* s, std::uint16_t* d, std::int64_t n, float scale) {
#if defined(__x86_64__) || defined(__i386__)
  if (has_avx2_f16c()) return float_to_bfloat16_avx2(s, d, n, scale);
#endif
  for (std::int64_t i = 0; i < n; ++i) d[i] = float_to_bfloat16_bits(s[i] * scale);
}

void bfloat16_to_float(const std::uint16_t* s, float* d, std::int64_t n) {
#if defined(__x86_64__) || defined(__i386__)
  if (has_avx2_f16c()) return bfloat16_to_float_avx2(s, d, n);
#endif
  for (std::int64_t i = 0; i < n; ++i) d[i] = bfloat16_bits_to_float(s[i]);
}

}  // namespace troupe::detail
