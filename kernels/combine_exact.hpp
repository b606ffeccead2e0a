#pragma once
// combine_exact — how every reduce op combines two integers or two bools,
// shared by the CPU kernels (kernels/reduce_kernels.cpp) and the CUDA kernels
// (cuda/kernels.cu) so that both give the same bits. Integer arithmetic runs
// in an unsigned type at least as wide as int, so that overflow wraps instead
// of being undefined; bools are bytes, any non-zero byte is true, results are
// 0 or 1.
//
// Internal linkage (unnamed namespace): reduce_kernels.cpp is compiled twice
// with different instruction sets, and the two copies must not be merged.

#include <cstdint>
#include <type_traits>

#include "troupe/reduce_op.hpp"

#if defined(__CUDACC__)
#define TROUPE_HOST_DEVICE __host__ __device__
#else
#define TROUPE_HOST_DEVICE
#endif

namespace troupe::detail {
namespace {

template <class T>
using wide_unsigned =
    std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

template <reduce_op::kind K, class T>
TROUPE_HOST_DEVICE inline T combine_int(T a, T b) {
  using U = wide_unsigned<T>;
  if constexpr (K == reduce_op::SUM) return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  if constexpr (K == reduce_op::PRODUCT)
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  if constexpr (K == reduce_op::MIN) return b < a ? b : a;
  if constexpr (K == reduce_op::MAX) return b > a ? b : a;
  if constexpr (K == reduce_op::BAND) return static_cast<T>(a & b);
  if constexpr (K == reduce_op::BOR) return static_cast<T>(a | b);
  if constexpr (K == reduce_op::BXOR) return static_cast<T>(a ^ b);
}

template <reduce_op::kind K>
TROUPE_HOST_DEVICE inline std::uint8_t combine_bool(std::uint8_t a, std::uint8_t b) {
  const bool x = a != 0, y = b != 0;
  if constexpr (K == reduce_op::SUM || K == reduce_op::MAX || K == reduce_op::BOR)
    return static_cast<std::uint8_t>(x | y);
  if constexpr (K == reduce_op::PRODUCT || K == reduce_op::MIN || K == reduce_op::BAND)
    return static_cast<std::uint8_t>(x & y);
  if constexpr (K == reduce_op::BXOR) return static_cast<std::uint8_t>(x ^ y);
}

}  // namespace
}  // namespace troupe::detail
