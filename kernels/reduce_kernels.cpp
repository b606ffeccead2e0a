// CPU reduction kernels. Each dtype has a policy (storage type, accumulation
// type, how to combine); one generic driver per entry point dispatches on
// (dtype, kind). Loops are blocked with constant inner trip counts and restrict
// pointers so that g++ -O2 vectorises them.
//
// This file is compiled twice: for the baseline instruction set (the
// *_generic entry points) and, on x86-64, with AVX2 (*_avx2, 256-bit vectors);
// reduce_dispatch.cpp picks one at run time. Neither build contracts
// multiplications and additions, so both give bit-identical results.

#include "reduce_kernels_impl.hpp"

#include <algorithm>
#include <complex>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "../base/half.hpp"
#include "combine_exact.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {
namespace {

using kind = reduce_op::kind;
template <kind K>
using kind_c = std::integral_constant<kind, K>;

// d[i] = f(d[i], s[i]).
template <class T, class F>
inline void zip(T* __restrict d, const T* __restrict s, std::size_t n, F f) {
  constexpr std::size_t block = 64 / sizeof(T);
  std::size_t i = 0;
  for (; i + block <= n; i += block)
    for (std::size_t j = 0; j < block; ++j) d[i + j] = f(d[i + j], s[i + j]);
  for (; i < n; ++i) d[i] = f(d[i], s[i]);
}

// d[i] = f(a[i], b[i]).
template <class T, class F>
inline void zip3(T* __restrict d, const T* __restrict a, const T* __restrict b, std::size_t n,
                 F f) {
  constexpr std::size_t block = 64 / sizeof(T);
  std::size_t i = 0;
  for (; i + block <= n; i += block)
    for (std::size_t j = 0; j < block; ++j) d[i + j] = f(a[i + j], b[i + j]);
  for (; i < n; ++i) d[i] = f(a[i], b[i]);
}

// d[i] = f(d[i]).
template <class T, class F>
inline void map(T* __restrict d, std::size_t n, F f) {
  constexpr std::size_t block = 64 / sizeof(T);
  std::size_t i = 0;
  for (; i + block <= n; i += block)
    for (std::size_t j = 0; j < block; ++j) d[i + j] = f(d[i + j]);
  for (; i < n; ++i) d[i] = f(d[i]);
}

// d[i] = f(s[i]) between element types.
template <class S, class D, class F>
inline void convert(const S* __restrict s, D* __restrict d, std::size_t n, F f) {
  constexpr std::size_t block = 16;
  std::size_t i = 0;
  for (; i + block <= n; i += block)
    for (std::size_t j = 0; j < block; ++j) d[i + j] = f(s[i + j]);
  for (; i < n; ++i) d[i] = f(s[i]);
}

template <kind K, class T>
inline T combine_float(T a, T b) {
  if constexpr (K == reduce_op::SUM) return a + b;
  if constexpr (K == reduce_op::PRODUCT) return a * b;
  // NaN in either operand propagates (a NaN `a` is kept because both tests fail).
  if constexpr (K == reduce_op::MIN) return ((b < a) | (b != b)) ? b : a;
  if constexpr (K == reduce_op::MAX) return ((b > a) | (b != b)) ? b : a;
}

// --- policies ---------------------------------------------------------------
// storage: element type in memory; acc: type combined in; width: acc values per
// element; direct: storage can be combined in place (acc* aliases storage*).

// Combines arrays element-wise with P::op<K>: in place (d op= s) or into a
// third array (d = a op b; no overlap).
template <class P, class T>
struct elementwise {
  template <kind K>
  static void combine(T* d, const T* s, std::size_t n) {
    zip(d, s, n, [](T a, T b) { return P::template op<K>(a, b); });
  }
  template <kind K>
  static void combine3(T* d, const T* a, const T* b, std::size_t n) {
    zip3(d, a, b, n, [](T x, T y) { return P::template op<K>(x, y); });
  }
};

template <class T>
struct int_policy : elementwise<int_policy<T>, T> {
  using storage = T;
  using acc = T;
  static constexpr std::size_t width = 1;
  static constexpr bool direct = true, ordered = true, bitwise = true, floating = false;
  template <kind K>
  static T op(T a, T b) {
    return combine_int<K>(a, b);
  }
};

struct bool_policy : elementwise<bool_policy, std::uint8_t> {
  using storage = std::uint8_t;
  using acc = std::uint8_t;
  static constexpr std::size_t width = 1;
  static constexpr bool direct = true, ordered = true, bitwise = true, floating = false;
  template <kind K>
  static std::uint8_t op(std::uint8_t a, std::uint8_t b) {
    return combine_bool<K>(a, b);
  }
};

template <class T>
struct float_policy : elementwise<float_policy<T>, T> {
  using storage = T;
  using acc = T;
  static constexpr std::size_t width = 1;
  static constexpr bool direct = true, ordered = true, bitwise = false, floating = true;
  template <kind K>
  static T op(T a, T b) {
    return combine_float<K>(a, b);
  }
};

template <float (*to_float)(std::uint16_t), std::uint16_t (*from_float)(float)>
struct half_policy : float_policy<float> {
  using storage = std::uint16_t;
  static constexpr bool direct = false;
  static void load(const storage* s, float* a, std::size_t n) { convert(s, a, n, to_float); }
  static void store(const float* a, storage* s, std::size_t n) { convert(a, s, n, from_float); }
};
using float16_policy = half_policy<half_bits_to_float, float_to_half_bits>;
using bfloat16_policy = half_policy<bfloat16_bits_to_float, float_to_bfloat16_bits>;

template <class R>
struct complex_policy {
  using storage = std::complex<R>;
  using acc = R;  // interleaved real, imaginary (the layout std::complex guarantees)
  static constexpr std::size_t width = 2;
  static constexpr bool direct = true, ordered = false, bitwise = false, floating = true;
  // Plain complex product (no C99 Annex G NaN recovery), like CUDA; vectorisable.
  template <kind K>
  static void combine3(acc* __restrict d, const acc* __restrict a, const acc* __restrict b,
                       std::size_t n) {
    if constexpr (K == reduce_op::PRODUCT) {
      for (std::size_t i = 0; i < n; ++i) {
        const R ar = a[2 * i], ai = a[2 * i + 1], br = b[2 * i], bi = b[2 * i + 1];
        d[2 * i] = ar * br - ai * bi;
        d[2 * i + 1] = ar * bi + ai * br;
      }
    } else {
      zip3(d, a, b, 2 * n, [](R x, R y) { return x + y; });
    }
  }
  template <kind K>
  static void combine(acc* __restrict d, const acc* __restrict s, std::size_t n) {
    if constexpr (K == reduce_op::PRODUCT) {
      for (std::size_t i = 0; i < n; ++i) {
        const R ar = d[2 * i], ai = d[2 * i + 1], br = s[2 * i], bi = s[2 * i + 1];
        d[2 * i] = ar * br - ai * bi;
        d[2 * i + 1] = ar * bi + ai * br;
      }
    } else {
      zip(d, s, 2 * n, [](R x, R y) { return x + y; });
    }
  }
};

// --- dispatch ---------------------------------------------------------------

template <class F>
void with_policy(const char* op, dtype t, F&& f) {
  switch (t) {
    case dtype::bool_:
      return f(bool_policy{});
    case dtype::uint8:
      return f(int_policy<std::uint8_t>{});
    case dtype::int8:
      return f(int_policy<std::int8_t>{});
    case dtype::int16:
      return f(int_policy<std::int16_t>{});
    case dtype::int32:
      return f(int_policy<std::int32_t>{});
    case dtype::int64:
      return f(int_policy<std::int64_t>{});
    case dtype::float16:
      return f(float16_policy{});
    case dtype::bfloat16:
      return f(bfloat16_policy{});
    case dtype::float32:
      return f(float_policy<float>{});
    case dtype::float64:
      return f(float_policy<double>{});
    case dtype::complex64:
      return f(complex_policy<float>{});
    case dtype::complex128:
      return f(complex_policy<double>{});
  }
  throw error(errc::invalid_argument,
              std::string(op) + ": unknown dtype " + std::to_string(static_cast<int>(t)));
}

// Calls f(kind_c<K>{}) with AVG and PREMUL_SUM mapped to SUM; only instantiates
// kinds the policy supports.
template <class P, class F>
void with_kind(const char* op, dtype t, kind k, F&& f) {
  if (!is_reduce_supported(k, t))
    throw error(errc::invalid_argument, std::string(op) + ": ReduceOp " + to_string(k) +
                                            " is not supported for dtype " +
                                            std::string(to_string(t)));
  switch (k) {
    case reduce_op::SUM:
    case reduce_op::AVG:
    case reduce_op::PREMUL_SUM:
      return f(kind_c<reduce_op::SUM>{});
    case reduce_op::PRODUCT:
      return f(kind_c<reduce_op::PRODUCT>{});
    default:
      break;
  }
  if constexpr (P::ordered) {
    if (k == reduce_op::MIN) return f(kind_c<reduce_op::MIN>{});
    if (k == reduce_op::MAX) return f(kind_c<reduce_op::MAX>{});
  }
  if constexpr (P::bitwise) {
    if (k == reduce_op::BAND) return f(kind_c<reduce_op::BAND>{});
    if (k == reduce_op::BOR) return f(kind_c<reduce_op::BOR>{});
    if (k == reduce_op::BXOR) return f(kind_c<reduce_op::BXOR>{});
  }
  throw error(errc::internal, std::string(op) + ": no kernel for ReduceOp " + to_string(k) +
                                  " and dtype " + std::string(to_string(t)));
}

// Elements per chunk of the on-stack accumulators (4 KiB each).
template <class P>
constexpr std::size_t chunk = 4096 / sizeof(typename P::acc) / P::width;

template <class P, kind K>
void into(void* dst, const void* src, std::size_t n) {
  using S = typename P::storage;
  using A = typename P::acc;
  auto* d = static_cast<S*>(dst);
  auto* s = static_cast<const S*>(src);
  if constexpr (P::direct) {
    P::template combine<K>(reinterpret_cast<A*>(d), reinterpret_cast<const A*>(s), n);
  } else {
    alignas(64) A a[chunk<P>], b[chunk<P>];
    for (std::size_t off = 0; off < n; off += chunk<P>) {
      const std::size_t m = std::min(chunk<P>, n - off);
      P::load(d + off, a, m);
      P::load(s + off, b, m);
      P::template combine<K>(a, b, m);
      P::store(a, d + off, m);
    }
  }
}

template <class P, kind K>
void many(void* dst, const void* const* srcs, std::size_t nsrc, std::size_t n, double divisor) {
  using S = typename P::storage;
  using A = typename P::acc;
  constexpr std::size_t c = chunk<P>;
  auto* d = static_cast<S*>(dst);
  const auto src = [&](std::size_t k, std::size_t off) {
    return static_cast<const S*>(srcs[k]) + off;
  };
  const auto as_acc = [](const S* p) { return reinterpret_cast<const A*>(p); };
  if constexpr (P::direct) {
    if (std::none_of(srcs, srcs + nsrc, [&](const void* s) { return s == dst; })) {
      // No aliasing: accumulate in dst itself, chunk by chunk so it stays in cache.
      if (nsrc == 1) {
        std::memcpy(d, srcs[0], n * sizeof(S));
        return;
      }
      for (std::size_t off = 0; off < n; off += c) {
        const std::size_t m = std::min(c, n - off);
        auto* a = reinterpret_cast<A*>(d + off);
        P::template combine3<K>(a, as_acc(src(0, off)), as_acc(src(1, off)), m);
        for (std::size_t k = 2; k < nsrc; ++k) P::template combine<K>(a, as_acc(src(k, off)), m);
      }
      return;
    }
  }
  if constexpr (P::direct) {
    if (dst == srcs[0] &&
        std::none_of(srcs + 1, srcs + nsrc, [&](const void* s) { return s == dst; })) {
      // dst is the first source (an in-place reduction): accumulate into it.
      for (std::size_t off = 0; off < n; off += c) {
        const std::size_t m = std::min(c, n - off);
        auto* a = reinterpret_cast<A*>(d + off);
        for (std::size_t k = 1; k < nsrc; ++k) P::template combine<K>(a, as_acc(src(k, off)), m);
      }
      return;
    }
  }
  // dst equals another source (or the type needs conversion): accumulate each chunk on the stack.
  alignas(64) A acc[c * P::width];
  for (std::size_t off = 0; off < n; off += c) {
    const std::size_t m = std::min(c, n - off);
    if constexpr (P::direct) {
      if (nsrc == 1) {
        std::memcpy(acc, src(0, off), m * sizeof(S));
      } else {
        P::template combine3<K>(acc, as_acc(src(0, off)), as_acc(src(1, off)), m);
      }
      for (std::size_t k = 2; k < nsrc; ++k) P::template combine<K>(acc, as_acc(src(k, off)), m);
      std::memcpy(d + off, acc, m * sizeof(S));
    } else {
      alignas(64) A tmp[c];
      P::load(src(0, off), acc, m);
      for (std::size_t k = 1; k < nsrc; ++k) {
        P::load(src(k, off), tmp, m);
        P::template combine<K>(acc, tmp, m);
      }
      // AVG divides before the one rounding.
      if constexpr (P::floating)
        if (divisor != 0) map(acc, m, [f = static_cast<A>(divisor)](A x) { return x / f; });
      P::store(acc, d + off, m);
    }
  }
}

template <class P>
void scale(const char* op, dtype t, void* data, std::size_t n, double factor, bool divide) {
  using A = typename P::acc;
  if constexpr (!P::floating) {
    throw error(errc::invalid_argument, std::string(op) + ": dtype " + std::string(to_string(t)) +
                                            " is not floating point or complex");
  } else {
    const A f = static_cast<A>(factor);
    const auto apply = [&](A* a, std::size_t m) {
      if (divide)
        map(a, m, [f](A x) { return x / f; });
      else
        map(a, m, [f](A x) { return x * f; });
    };
    if constexpr (P::direct) {
      apply(static_cast<A*>(data), n * P::width);
    } else {
      auto* s = static_cast<typename P::storage*>(data);
      alignas(64) A a[chunk<P>];
      for (std::size_t off = 0; off < n; off += chunk<P>) {
        const std::size_t m = std::min(chunk<P>, n - off);
        P::load(s + off, a, m);
        apply(a, m);
        P::store(a, s + off, m);
      }
    }
  }
}

}  // namespace

void TROUPE_KERNEL(reduce_into)(dtype t, reduce_op::kind op, void* dst, const void* src,
                                std::size_t n) {
  with_policy("reduce_into", t, [&](auto p) {
    using P = decltype(p);
    with_kind<P>("reduce_into", t, op, [&](auto k) {
      if (n) into<P, decltype(k)::value>(dst, src, n);
    });
  });
}

void TROUPE_KERNEL(reduce_many)(dtype t, reduce_op::kind op, void* dst, const void* const* srcs,
                                std::size_t nsrc, std::size_t n, double divisor) {
  with_policy("reduce_many", t, [&](auto p) {
    using P = decltype(p);
    with_kind<P>("reduce_many", t, op, [&](auto k) {
      if (!n || !nsrc) return;
      many<P, decltype(k)::value>(dst, srcs, nsrc, n, P::direct ? 0.0 : divisor);
      // Types without conversion divide afterwards (the same result).
      if (P::direct && divisor != 0) scale<P>("reduce_many", t, dst, n, divisor, true);
    });
  });
}

void TROUPE_KERNEL(scale_by)(dtype t, void* data, std::size_t n, double factor) {
  with_policy("scale_by", t,
              [&](auto p) { scale<decltype(p)>("scale_by", t, data, n, factor, false); });
}

void TROUPE_KERNEL(divide_by)(dtype t, void* data, std::size_t n, double divisor) {
  with_policy("divide_by", t,
              [&](auto p) { scale<decltype(p)>("divide_by", t, data, n, divisor, true); });
}

}  // namespace troupe::detail
