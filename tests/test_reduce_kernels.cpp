// The CPU reduction kernels against straightforward reference
// implementations, for every dtype and supported op.

#include <doctest/doctest.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "../kernels/reduce_kernels.hpp"
#include "../kernels/reduce_kernels_impl.hpp"
#include "check_error.hpp"
#include "troupe/error.hpp"
#include "troupe/reduce_op.hpp"

using namespace troupe;
using troupe::test::check_exact_error;
using kind = reduce_op::kind;

namespace {

const kind all_kinds[] = {reduce_op::SUM, reduce_op::AVG,  reduce_op::PRODUCT,
                          reduce_op::MIN, reduce_op::MAX,  reduce_op::BAND,
                          reduce_op::BOR, reduce_op::BXOR, reduce_op::PREMUL_SUM};

}  // namespace

namespace {

// Reference model per storage type: values are lifted to a wide type (exact
// for integers, double for floating), combined there, and compared back.
template <class T>
struct model;

template <class T>
struct int_model {
  using M = T;
  static M up(T v) { return v; }
  static T gen(std::mt19937_64& rng) { return static_cast<T>(rng()); }  // full range: overflows
  static M apply(kind k, M a, M b) {
    switch (k) {
      case reduce_op::SUM:
        return static_cast<T>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
      case reduce_op::PRODUCT:
        return static_cast<T>(static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b));
      case reduce_op::MIN:
        return std::min(a, b);
      case reduce_op::MAX:
        return std::max(a, b);
      case reduce_op::BAND:
        return static_cast<T>(a & b);
      case reduce_op::BOR:
        return static_cast<T>(a | b);
      case reduce_op::BXOR:
        return static_cast<T>(a ^ b);
      default:
        FAIL("bad kind");
        return a;
    }
  }
  static bool close(T got, M ref) { return got == ref; }
};
template <>
struct model<std::uint8_t> : int_model<std::uint8_t> {};
template <>
struct model<std::int8_t> : int_model<std::int8_t> {};
template <>
struct model<std::int16_t> : int_model<std::int16_t> {};
template <>
struct model<std::int32_t> : int_model<std::int32_t> {};
template <>
struct model<std::int64_t> : int_model<std::int64_t> {};

// bool, stored as bytes (non-canonical true bytes included).
struct bool_byte {
  std::uint8_t v;
};
template <>
struct model<bool_byte> {
  using M = bool;
  static M up(bool_byte b) { return b.v != 0; }
  static bool_byte gen(std::mt19937_64& rng) {
    const auto r = rng() % 4;
    return {static_cast<std::uint8_t>(r == 0 ? 0 : r == 1 ? 1 : r == 2 ? 0 : 0x80)};
  }
  static M apply(kind k, M a, M b) {
    switch (k) {
      case reduce_op::SUM:
      case reduce_op::MAX:
      case reduce_op::BOR:
        return a || b;
      case reduce_op::PRODUCT:
      case reduce_op::MIN:
      case reduce_op::BAND:
        return a && b;
      case reduce_op::BXOR:
        return a != b;
      default:
        FAIL("bad kind");
        return a;
    }
  }
  static bool close(bool_byte got, M ref) { return got.v == (ref ? 1 : 0); }
};

template <class T, int RelTolExp>
struct float_model {
  using M = double;
  static M up(T v) {
    if constexpr (std::is_same_v<T, double>)
      return v;
    else
      return static_cast<double>(static_cast<float>(v));
  }
  static T gen(std::mt19937_64& rng) {
    std::uniform_real_distribution<double> d(-2.0, 2.0);
    return T(static_cast<float>(d(rng)));
  }
  static M apply(kind k, M a, M b) {
    switch (k) {
      case reduce_op::SUM:
      case reduce_op::AVG:
      case reduce_op::PREMUL_SUM:
        return a + b;
      case reduce_op::PRODUCT:
        return a * b;
      case reduce_op::MIN:
        return std::min(a, b);
      case reduce_op::MAX:
        return std::max(a, b);
      default:
        FAIL("bad kind");
        return a;
    }
  }
  static bool close(T got, M ref) {
    const double tol = std::pow(10.0, RelTolExp) * std::max(1.0, std::abs(ref));
    return std::abs(up(got) - ref) <= tol;
  }
};
template <>
struct model<float16_t> : float_model<float16_t, -2> {};
template <>
struct model<bfloat16_t> : float_model<bfloat16_t, -2> {
  static bool close(bfloat16_t got, M ref) {
    return std::abs(up(got) - ref) <= 2e-2 * std::max(1.0, std::abs(ref));
  }
};
template <>
struct model<float> : float_model<float, -5> {};
template <>
struct model<double> : float_model<double, -12> {
  static double gen(std::mt19937_64& rng) {
    return std::uniform_real_distribution<double>(-2, 2)(rng);
  }
};

template <class R, int RelTolExp>
struct complex_model {
  using T = std::complex<R>;
  using M = std::complex<double>;
  static M up(T v) { return {v.real(), v.imag()}; }
  static T gen(std::mt19937_64& rng) {
    std::uniform_real_distribution<R> d(-2, 2);
    return {d(rng), d(rng)};
  }
  static M apply(kind k, M a, M b) {
    switch (k) {
      case reduce_op::SUM:
      case reduce_op::AVG:
      case reduce_op::PREMUL_SUM:
        return a + b;
      case reduce_op::PRODUCT:
        return a * b;
      default:
        FAIL("bad kind");
        return a;
    }
  }
  static bool close(T got, M ref) {
    const double tol = std::pow(10.0, RelTolExp) * std::max(1.0, std::abs(ref));
    return std::abs(up(got) - ref) <= tol;
  }
};
template <>
struct model<std::complex<float>> : complex_model<float, -5> {};
template <>
struct model<std::complex<double>> : complex_model<double, -12> {};

template <class T>
void check_kernels(dtype t) {
  using mdl = model<T>;
  std::mt19937_64 rng(1234 + static_cast<int>(t));
  for (kind k : all_kinds) {
    const std::string kname = to_string(k);
    if (!is_reduce_supported(k, t)) {
      T a{}, b{};
      check_exact_error([&] { detail::reduce_into(t, k, &a, &b, 1); }, errc::invalid_argument,
                        std::string("reduce_into: ReduceOp ") + to_string(k) +
                            " is not supported for dtype " + std::string(to_string(t)));
      const void* srcs[] = {&b};
      check_exact_error([&] { detail::reduce_many(t, k, &a, srcs, 1, 1); }, errc::invalid_argument,
                        std::string("reduce_many: ReduceOp ") + to_string(k) +
                            " is not supported for dtype " + std::string(to_string(t)));
      continue;
    }
    // Sizes straddle the kernels' blocks and 4 KiB chunks.
    for (std::size_t n : {0, 1, 3, 17, 64, 255, 1000, 1025, 3000}) {
      CAPTURE(to_string(t));
      CAPTURE(kname);
      CAPTURE(n);
      constexpr std::size_t nsrc = 5;
      std::vector<std::vector<T>> src(nsrc, std::vector<T>(n));
      for (auto& s : src)
        for (auto& v : s) v = mdl::gen(rng);

      // reduce_into: dst = src0 op src1.
      auto dst = src[0];
      detail::reduce_into(t, k, dst.data(), src[1].data(), n);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i)
        if (!mdl::close(dst[i], mdl::apply(k, mdl::up(src[0][i]), mdl::up(src[1][i])))) ++bad;
      CHECK(bad == 0);

      // reduce_many over 1..nsrc sources, into a separate buffer.
      for (std::size_t m = 1; m <= nsrc; ++m) {
        std::vector<const void*> ptrs;
        for (std::size_t j = 0; j < m; ++j) ptrs.push_back(src[j].data());
        std::vector<T> out(n);
        detail::reduce_many(t, k, out.data(), ptrs.data(), m, n);
        bad = 0;
        for (std::size_t i = 0; i < n; ++i) {
          auto ref = mdl::up(src[0][i]);
          for (std::size_t j = 1; j < m; ++j) ref = mdl::apply(k, ref, mdl::up(src[j][i]));
          if (m == 1) {
            if (std::memcmp(&out[i], &src[0][i], sizeof(T)) != 0) ++bad;  // plain copy
          } else if (!mdl::close(out[i], ref)) {
            ++bad;
          }
        }
        CHECK(bad == 0);
      }

      // reduce_many with the destination equal to a source (first and a later one).
      for (std::size_t alias : {std::size_t{0}, std::size_t{2}}) {
        auto copy = src;
        std::vector<const void*> ptrs;
        for (auto& s : copy) ptrs.push_back(s.data());
        detail::reduce_many(t, k, copy[alias].data(), ptrs.data(), nsrc, n);
        bad = 0;
        for (std::size_t i = 0; i < n; ++i) {
          auto ref = mdl::up(src[0][i]);
          for (std::size_t j = 1; j < nsrc; ++j) ref = mdl::apply(k, ref, mdl::up(src[j][i]));
          if (!mdl::close(copy[alias][i], ref)) ++bad;
        }
        CHECK(bad == 0);
      }
    }
  }
}

}  // namespace

TEST_CASE("reduce kernels against a reference, every dtype and supported op") {
  check_kernels<bool_byte>(dtype::bool_);
  check_kernels<std::uint8_t>(dtype::uint8);
  check_kernels<std::int8_t>(dtype::int8);
  check_kernels<std::int16_t>(dtype::int16);
  check_kernels<std::int32_t>(dtype::int32);
  check_kernels<std::int64_t>(dtype::int64);
  check_kernels<float16_t>(dtype::float16);
  check_kernels<bfloat16_t>(dtype::bfloat16);
  check_kernels<float>(dtype::float32);
  check_kernels<double>(dtype::float64);
  check_kernels<std::complex<float>>(dtype::complex64);
  check_kernels<std::complex<double>>(dtype::complex128);
}

TEST_CASE("integer reductions wrap around") {
  {
    std::int8_t d[] = {127, -128, -128, 100};
    std::int8_t s[] = {1, -1, -1, 100};
    detail::reduce_into(dtype::int8, reduce_op::SUM, d, s, 2);
    detail::reduce_into(dtype::int8, reduce_op::PRODUCT, d + 2, s + 2, 2);
    CHECK(d[0] == -128);
    CHECK(d[1] == 127);
    CHECK(d[2] == -128);  // -128 * -1 wraps
    CHECK(d[3] == 16);    // 10000 mod 256
  }
  {
    std::uint8_t d[] = {200, 16};
    std::uint8_t s[] = {100, 16};
    detail::reduce_into(dtype::uint8, reduce_op::SUM, d, s, 1);
    detail::reduce_into(dtype::uint8, reduce_op::PRODUCT, d + 1, s + 1, 1);
    CHECK(d[0] == 44);
    CHECK(d[1] == 0);
  }
  {
    std::int16_t d[] = {300, 32767};
    std::int16_t s[] = {300, 2};
    detail::reduce_into(dtype::int16, reduce_op::PRODUCT, d, s, 2);
    CHECK(d[0] == 24464);  // 90000 - 65536
    CHECK(d[1] == -2);
  }
  {
    const auto max = std::numeric_limits<std::int64_t>::max();
    std::int64_t a[] = {max, max};
    std::int64_t b[] = {1, 2};
    std::int64_t c[] = {1, 1};
    const void* srcs[] = {a, b, c};
    std::int64_t out[2];
    detail::reduce_many(dtype::int64, reduce_op::SUM, out, srcs, 3, 2);
    CHECK(out[0] == std::numeric_limits<std::int64_t>::min() + 1);
    detail::reduce_many(dtype::int64, reduce_op::PRODUCT, out, srcs, 2, 2);
    CHECK(out[1] == -2);
  }
  {
    std::int32_t d[] = {std::numeric_limits<std::int32_t>::min()};
    std::int32_t s[] = {-1};
    detail::reduce_into(dtype::int32, reduce_op::PRODUCT, d, s, 1);
    CHECK(d[0] == std::numeric_limits<std::int32_t>::min());
  }
}

TEST_CASE("floating MIN/MAX propagate NaN; bool is logical") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float d[] = {nan, 1, 2, -0.5f};
  float s[] = {1, nan, 3, -1};
  detail::reduce_into(dtype::float32, reduce_op::MIN, d, s, 4);
  CHECK(std::isnan(d[0]));
  CHECK(std::isnan(d[1]));
  CHECK(d[2] == 2);
  CHECK(d[3] == -1);
  double dd[] = {1, nan};
  double ds[] = {nan, 1};
  detail::reduce_into(dtype::float64, reduce_op::MAX, dd, ds, 2);
  CHECK(std::isnan(dd[0]));
  CHECK(std::isnan(dd[1]));

  std::uint8_t b[] = {2, 2, 0, 1};
  std::uint8_t c[] = {4, 0, 0, 1};
  auto e = std::vector<std::uint8_t>(b, b + 4);
  detail::reduce_into(dtype::bool_, reduce_op::BAND, e.data(), c, 4);
  CHECK(e == std::vector<std::uint8_t>{1, 0, 0, 1});  // logical, not bytewise (2 & 4 = 0)
  e.assign(b, b + 4);
  detail::reduce_into(dtype::bool_, reduce_op::BXOR, e.data(), c, 4);
  CHECK(e == std::vector<std::uint8_t>{0, 1, 0, 0});
  e.assign(b, b + 4);
  detail::reduce_into(dtype::bool_, reduce_op::SUM, e.data(), c, 4);
  CHECK(e == std::vector<std::uint8_t>{1, 1, 0, 1});
}

TEST_CASE("half precision chains round once") {
  // 2048 + 1 + 1 in float16: rounding after each step gives 2048 (ties to even),
  // accumulating in float32 gives 2050 exactly.
  float16_t a[] = {float16_t(2048.0f)};
  float16_t b[] = {float16_t(1.0f)};
  float16_t c[] = {float16_t(1.0f)};
  const void* srcs[] = {a, b, c};
  float16_t out[1];
  detail::reduce_many(dtype::float16, reduce_op::SUM, out, srcs, 3, 1);
  CHECK(static_cast<float>(out[0]) == 2050.0f);
  detail::reduce_into(dtype::float16, reduce_op::SUM, a, b, 1);
  detail::reduce_into(dtype::float16, reduce_op::SUM, a, c, 1);
  CHECK(static_cast<float>(a[0]) == 2048.0f);

  bfloat16_t x[] = {bfloat16_t(256.0f)};
  bfloat16_t y[] = {bfloat16_t(1.0f)};
  const void* bsrcs[] = {x, y, y};
  bfloat16_t bout[1];
  detail::reduce_many(dtype::bfloat16, reduce_op::SUM, bout, bsrcs, 3, 1);
  CHECK(static_cast<float>(bout[0]) == 258.0f);
}

TEST_CASE("scale_by and divide_by") {
  std::vector<float> f{1, 2, 3, -4};
  detail::scale_by(dtype::float32, f.data(), f.size(), 0.5);
  CHECK(f == std::vector<float>{0.5f, 1, 1.5f, -2});
  std::vector<double> d(100, 1.0);
  detail::divide_by(dtype::float64, d.data(), d.size(), 3.0);
  for (double v : d) CHECK(v == 1.0 / 3.0);
  std::vector<float> g(37, 1.0f);
  detail::divide_by(dtype::float32, g.data(), g.size(), 3.0);
  for (float v : g) CHECK(v == 1.0f / 3.0f);

  std::vector<float16_t> h(1500, float16_t(3.0f));
  detail::scale_by(dtype::float16, h.data(), h.size(), 0.25);
  for (auto v : h) CHECK(static_cast<float>(v) == 0.75f);
  detail::divide_by(dtype::float16, h.data(), h.size(), 3.0);
  for (auto v : h) CHECK(static_cast<float>(v) == 0.25f);
  std::vector<bfloat16_t> bf(3, bfloat16_t(6.0f));
  detail::divide_by(dtype::bfloat16, bf.data(), bf.size(), 4.0);
  for (auto v : bf) CHECK(static_cast<float>(v) == 1.5f);

  std::vector<std::complex<double>> c{{1, 2}, {-3, 4}};
  detail::scale_by(dtype::complex128, c.data(), c.size(), 2.0);
  CHECK(c[0] == std::complex<double>(2, 4));
  CHECK(c[1] == std::complex<double>(-6, 8));
  std::vector<std::complex<float>> cf{{2, 4}};
  detail::divide_by(dtype::complex64, cf.data(), cf.size(), 2.0);
  CHECK(cf[0] == std::complex<float>(1, 2));

  detail::scale_by(dtype::float32, nullptr, 0, 2.0);  // n = 0 is fine
  std::int32_t i[] = {1};
  check_exact_error([&] { detail::scale_by(dtype::int32, i, 1, 2.0); }, errc::invalid_argument,
                    "scale_by: dtype int32 is not floating point or complex");
  check_exact_error([&] { detail::divide_by(dtype::bool_, i, 0, 2.0); }, errc::invalid_argument,
                    "divide_by: dtype bool is not floating point or complex");
}

TEST_CASE("kernels accept n = 0 and null pointers") {
  for (int ti = 0; ti < dtype_count; ++ti) {
    const auto t = static_cast<dtype>(ti);
    CHECK_NOTHROW(detail::reduce_into(t, reduce_op::SUM, nullptr, nullptr, 0));
    CHECK_NOTHROW(detail::reduce_many(t, reduce_op::PRODUCT, nullptr, nullptr, 0, 0));
  }
  float x[] = {5};
  detail::reduce_many(dtype::float32, reduce_op::SUM, x, nullptr, 0, 1);  // no sources: unchanged
  CHECK(x[0] == 5);
}

TEST_CASE("sums of a few floating-point elements give the kernels' bits") {
  // reduce_many sums up to 64 bytes of float32/float64 without the kernels'
  // dispatch (a 4-byte allreduce): the same order, so the same bits, also
  // with the destination one of the sources.
  std::mt19937_64 rng{11};
  auto run = [&](auto zero, dtype t) {
    using T = decltype(zero);
    std::uniform_real_distribution<double> gen(-1e3, 1e3);
    for (std::size_t n = 1; n <= 64 / sizeof(T) + 1; ++n)
      for (std::size_t m = 1; m <= 5; ++m)
        for (int alias : {-1, 0, 1}) {
          if (alias >= static_cast<int>(m)) continue;
          std::vector<std::vector<T>> src(m, std::vector<T>(n));
          for (auto& v : src)
            for (auto& x : v) x = static_cast<T>(gen(rng));
          auto copy = src;
          std::vector<const void*> a, b;
          for (auto& v : src) a.push_back(v.data());
          for (auto& v : copy) b.push_back(v.data());
          std::vector<T> out_a(n), out_b(n);
          T* dst_a = alias < 0 ? out_a.data() : src[static_cast<std::size_t>(alias)].data();
          T* dst_b = alias < 0 ? out_b.data() : copy[static_cast<std::size_t>(alias)].data();
          detail::reduce_many(t, reduce_op::SUM, dst_a, a.data(), m, n);
          detail::reduce_many_generic(t, reduce_op::SUM, dst_b, b.data(), m, n, 0.0);
          CAPTURE(to_string(t));
          CAPTURE(n);
          CAPTURE(m);
          CAPTURE(alias);
          CHECK(std::memcmp(dst_a, dst_b, n * sizeof(T)) == 0);
        }
  };
  run(float{}, dtype::float32);
  run(double{}, dtype::float64);
}

TEST_CASE("the AVX2 build of the kernels gives the baseline build's bits") {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx2")) {
    MESSAGE("no AVX2 on this CPU: only the baseline build runs");
    return;
  }
  std::mt19937_64 rng{7};
  const dtype dtypes[] = {dtype::float32,   dtype::float64, dtype::float16, dtype::bfloat16,
                          dtype::complex64, dtype::int32,   dtype::int64,   dtype::uint8,
                          dtype::int8,      dtype::bool_};
  for (dtype t : dtypes)
    for (kind k : all_kinds) {
      const std::size_t n = 1000 + 37;  // blocks plus a ragged tail
      const std::size_t bytes = n * element_size(t);
      std::vector<std::vector<std::uint8_t>> srcs(4, std::vector<std::uint8_t>(bytes));
      for (auto& s : srcs) {
        for (auto& b : s) b = t == dtype::bool_ ? std::uint8_t(rng() % 2) : std::uint8_t(rng());
        // Floating values finite (clear the top exponent bit): which NaN payload
        // survives a NaN op NaN depends on operand order, which is not a result.
        const std::size_t w = t == dtype::complex64 ? 4 : element_size(t);
        if (is_floating_point(t) || is_complex(t))
          for (std::size_t i = w - 1; i < bytes; i += w) s[i] &= 0xBF;
      }
      std::vector<const void*> ptrs;
      for (auto& s : srcs) ptrs.push_back(s.data());
      std::vector<std::uint8_t> a(bytes), b(bytes);
      bool supported = true;
      try {
        detail::reduce_many_generic(t, k, a.data(), ptrs.data(), ptrs.size(), n, 0.0);
      } catch (const error&) {
        supported = false;  // (dtype, op) pairs the kernels refuse: both builds refuse
      }
      if (!supported) {
        CHECK_THROWS_AS(detail::reduce_many_avx2(t, k, b.data(), ptrs.data(), ptrs.size(), n, 0.0),
                        error);
        continue;
      }
      detail::reduce_many_avx2(t, k, b.data(), ptrs.data(), ptrs.size(), n, 0.0);
      CAPTURE(to_string(t));
      CAPTURE(to_string(k));
      // NaN payloads compare by bits too: both builds must take the same path.
      CHECK(std::memcmp(a.data(), b.data(), bytes) == 0);
      // In place (dst is the first source) as the inline engine calls it.
      auto c = srcs[0], d = srcs[0];
      std::vector<const void*> pc{c.data(), srcs[1].data(), srcs[2].data()};
      std::vector<const void*> pd{d.data(), srcs[1].data(), srcs[2].data()};
      detail::reduce_many_generic(t, k, c.data(), pc.data(), pc.size(), n, 0.0);
      detail::reduce_many_avx2(t, k, d.data(), pd.data(), pd.size(), n, 0.0);
      CHECK(std::memcmp(c.data(), d.data(), bytes) == 0);
    }
#else
  MESSAGE("not x86-64: only the baseline build exists");
#endif
}
