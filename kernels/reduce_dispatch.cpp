// Picks the build of the reduction kernels for this CPU (see reduce_kernels.cpp).

#include "reduce_kernels_impl.hpp"

namespace troupe::detail {

namespace {

bool use_avx2() {
#if defined(TROUPE_HAVE_AVX2_KERNELS) && defined(__x86_64__)
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
#else
  return false;
#endif
}

}  // namespace

#if defined(TROUPE_HAVE_AVX2_KERNELS) && defined(__x86_64__)
#define TROUPE_PICK(name, ...) (use_avx2() ? name##_avx2(__VA_ARGS__) : name##_generic(__VA_ARGS__))
#else
#define TROUPE_PICK(name, ...) (name##_generic(__VA_ARGS__))
#endif

void reduce_into(dtype t, reduce_op::kind op, void* dst, const void* src, std::size_t n) {
  TROUPE_PICK(reduce_into, t, op, dst, src, n);
}

void reduce_many(dtype t, reduce_op::kind op, void* dst, const void* const* srcs, std::size_t nsrc,
                 std::size_t n, double divisor) {
  TROUPE_PICK(reduce_many, t, op, dst, srcs, nsrc, n, divisor);
}

void scale_by(dtype t, void* data, std::size_t n, double factor) {
  TROUPE_PICK(scale_by, t, data, n, factor);
}

void divide_by(dtype t, void* data, std::size_t n, double divisor) {
  TROUPE_PICK(divide_by, t, data, n, divisor);
}

}  // namespace troupe::detail
