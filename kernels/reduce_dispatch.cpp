// Picks the build of the reduction kernels for this CPU (see reduce_kernels.cpp).

#include "reduce_kernels_impl.hpp"

#include <cstring>

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

/// Sums a few floating-point elements (a 4-byte allreduce) where the
/// kernels' dispatch by type, operation and aliasing would cost more than
/// the additions: the same order (source 0, then 1, ...), so the same bits.
template <class T>
bool sum_few(void* dst, const void* const* srcs, std::size_t nsrc, std::size_t n) {
  constexpr std::size_t most = 64 / sizeof(T);
  if (n > most || nsrc == 0) return false;
  T out[most];
  for (std::size_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, static_cast<const T*>(srcs[0]) + i, sizeof(T));
    for (std::size_t k = 1; k < nsrc; ++k) {
      std::memcpy(&b, static_cast<const T*>(srcs[k]) + i, sizeof(T));
      a = a + b;
    }
    out[i] = a;
  }
  std::memcpy(dst, out, n * sizeof(T));  // after every read: dst may be a source
  return true;
}

bool reduce_few(dtype t, reduce_op::kind op, void* dst, const void* const* srcs, std::size_t nsrc,
                std::size_t n, double divisor) {
  if (op != reduce_op::SUM || divisor != 0) return false;
  if (t == dtype::float32) return sum_few<float>(dst, srcs, nsrc, n);
  if (t == dtype::float64) return sum_few<double>(dst, srcs, nsrc, n);
  return false;
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
  if (reduce_few(t, op, dst, srcs, nsrc, n, divisor)) return;
  TROUPE_PICK(reduce_many, t, op, dst, srcs, nsrc, n, divisor);
}

void scale_by(dtype t, void* data, std::size_t n, double factor) {
  TROUPE_PICK(scale_by, t, data, n, factor);
}

void divide_by(dtype t, void* data, std::size_t n, double divisor) {
  TROUPE_PICK(divide_by, t, data, n, divisor);
}

}  // namespace troupe::detail
