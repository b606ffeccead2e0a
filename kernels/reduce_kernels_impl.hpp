#pragma once
// The builds of the reduction kernels (reduce_kernels.cpp is compiled once
// per instruction set) and what reduce_dispatch.cpp chooses from.

#include "reduce_kernels.hpp"

#ifdef TROUPE_KERNELS_AVX2
#define TROUPE_KERNEL(name) name##_avx2
#else
#define TROUPE_KERNEL(name) name##_generic
#endif

namespace troupe::detail {

#define TROUPE_DECLARE_KERNELS(suffix)                                                       \
  void reduce_into_##suffix(dtype t, reduce_op::kind op, void* dst, const void* src,         \
                            std::size_t n);                                                  \
  void reduce_many_##suffix(dtype t, reduce_op::kind op, void* dst, const void* const* srcs, \
                            std::size_t nsrc, std::size_t n, double divisor);                \
  void scale_by_##suffix(dtype t, void* data, std::size_t n, double factor);                 \
  void divide_by_##suffix(dtype t, void* data, std::size_t n, double divisor);

TROUPE_DECLARE_KERNELS(generic)
TROUPE_DECLARE_KERNELS(avx2)

#undef TROUPE_DECLARE_KERNELS

}  // namespace troupe::detail
