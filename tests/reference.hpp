#pragma once
// A plain serial reference for the collective tests: tensors of any dtype are
// read as complex<double> values, reduced one rank after another, and compared
// with a tolerance that fits the dtype. Random inputs are small integers (never
// all zero), so sums and products are exact in every dtype and integer
// overflow wraps the same way in troupe and here.

#include <doctest/doctest.h>

#include <complex>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "troupe/troupe.hpp"

namespace ref {

using troupe::dtype;
using troupe::reduce_op;
using troupe::tensor;
using value = std::complex<double>;
using values = std::vector<value>;

template <class F>
void visit(dtype t, F&& f) {
  using namespace troupe;
  switch (t) {
    case dtype::bool_:
      return f(bool{});
    case dtype::uint8:
      return f(std::uint8_t{});
    case dtype::int8:
      return f(std::int8_t{});
    case dtype::int16:
      return f(std::int16_t{});
    case dtype::int32:
      return f(std::int32_t{});
    case dtype::int64:
      return f(std::int64_t{});
    case dtype::float16:
      return f(float16_t{});
    case dtype::bfloat16:
      return f(bfloat16_t{});
    case dtype::float32:
      return f(float{});
    case dtype::float64:
      return f(double{});
    case dtype::complex64:
      return f(std::complex<float>{});
    case dtype::complex128:
      return f(std::complex<double>{});
  }
}

template <class T>
value to_value(T x) {
  if constexpr (std::is_same_v<T, std::complex<float>> || std::is_same_v<T, std::complex<double>>)
    return value(x.real(), x.imag());
  else if constexpr (std::is_same_v<T, troupe::float16_t> || std::is_same_v<T, troupe::bfloat16_t>)
    return value(static_cast<float>(x), 0);
  else
    return value(static_cast<double>(x), 0);
}

template <class T>
T from_value(value v) {
  if constexpr (std::is_same_v<T, std::complex<float>> || std::is_same_v<T, std::complex<double>>)
    return T(static_cast<typename T::value_type>(v.real()),
             static_cast<typename T::value_type>(v.imag()));
  else if constexpr (std::is_same_v<T, troupe::float16_t> || std::is_same_v<T, troupe::bfloat16_t>)
    return T(static_cast<float>(v.real()));
  else if constexpr (std::is_same_v<T, bool>)
    return v.real() != 0;
  else if constexpr (std::is_integral_v<T>)
    return static_cast<T>(static_cast<std::int64_t>(v.real()));  // wraps like troupe
  else
    return static_cast<T>(v.real());
}

/// The device the collective suites put their tensors on: cuda:0 when
/// TROUPE_TEST_DEVICE=cuda (the gpu-labelled runs of the suites), else the CPU.
inline troupe::device device() {
  static const troupe::device d = [] {
    const char* e = std::getenv("TROUPE_TEST_DEVICE");
    return e && std::string(e) == "cuda" ? troupe::device::cuda(0) : troupe::device::cpu();
  }();
  return d;
}

/// tensor::zeros / tensor::empty on the suites' device.
inline tensor zeros(troupe::shape_t shape, dtype t) {
  return tensor::zeros(std::move(shape), t, device());
}
inline tensor empty(troupe::shape_t shape, dtype t) {
  return tensor::empty(std::move(shape), t, device());
}

/// A host copy of `t` (itself when it is on the CPU).
inline tensor host(const tensor& t) {
  if (t.is_cpu()) return t;
  auto h = tensor::empty(t.shape(), t.scalar_type());
  h.copy_from(t);
  return h;
}

inline values read(const tensor& device_tensor) {
  const auto t = host(device_tensor);
  values r(static_cast<std::size_t>(t.numel()));
  visit(t.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    auto* p = t.data_as<T>();
    for (std::size_t i = 0; i < r.size(); ++i) r[i] = to_value(p[i]);
  });
  return r;
}

inline tensor make(dtype t, const values& v, troupe::shape_t shape = {}) {
  if (shape.empty()) shape = {static_cast<std::int64_t>(v.size())};
  auto r = tensor::empty(shape, t);
  visit(t, [&](auto tag) {
    using T = decltype(tag);
    auto* p = r.data_as<T>();
    for (std::size_t i = 0; i < v.size(); ++i) p[i] = from_value<T>(v[i]);
  });
  if (device() == r.get_device()) return r;
  auto d = tensor::empty(shape, t, device());
  d.copy_from(r);
  return d;
}

/// splitmix64: the inputs need only be irregular and reproducible, and the
/// suite draws hundreds of millions of them (a Mersenne twister took a
/// quarter of test_allreduce's time).
struct quick_random {
  std::uint64_t state;
  std::uint64_t operator()() noexcept {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
};

/// Random small integers (as values) fitting `t` and `op`: never all zero.
inline values random_values(dtype t, std::int64_t n, std::uint64_t seed,
                            reduce_op::kind op = reduce_op::SUM) {
  quick_random gen{seed * 7919 + 17};
  values r(static_cast<std::size_t>(n));
  const bool is_bool = t == dtype::bool_;
  const bool is_unsigned = t == dtype::uint8;
  const bool product = op == reduce_op::PRODUCT;
  for (auto& x : r) {
    int a;
    if (is_bool) {
      a = static_cast<int>(gen() % 2);
    } else if (product) {
      static const int choices[] = {-2, -1, 1, 2};
      a = choices[gen() % 4];
      if (is_unsigned) a = a < 0 ? 1 : a;
    } else {
      a = static_cast<int>(gen() % 11) - 5;
      if (is_unsigned) a += 5;
    }
    double b = troupe::is_complex(t) ? static_cast<double>(static_cast<int>(gen() % 5) - 2) : 0.0;
    x = value(a, b);
  }
  if (n > 0) r[0] = value(is_bool ? 1 : 2, 0);  // never all zero
  return r;
}

/// inputs[r] reduced over r (in rank order) with `op`, on `t`; AVG divides by `divisor`.
inline values reduce(const std::vector<values>& inputs, const reduce_op& op, dtype t,
                     double divisor = 0) {
  values acc = inputs.at(0);
  auto k = op.op();
  if (t == dtype::bool_)
    k = k == reduce_op::SUM ? reduce_op::MAX : k == reduce_op::PRODUCT ? reduce_op::MIN : k;
  const double scale = k == reduce_op::PREMUL_SUM ? op.scale() : 1.0;
  for (auto& v : acc) v *= scale;
  for (std::size_t r = 1; r < inputs.size(); ++r)
    for (std::size_t i = 0; i < acc.size(); ++i) {
      auto a = acc[i];
      auto b = inputs[r][i];
      auto ia = static_cast<std::int64_t>(a.real());
      auto ib = static_cast<std::int64_t>(b.real());
      switch (k) {
        case reduce_op::SUM:
        case reduce_op::AVG:
          acc[i] = a + b;
          break;
        case reduce_op::PREMUL_SUM:
          acc[i] = a + b * scale;
          break;
        case reduce_op::PRODUCT:
          acc[i] = a * b;
          break;
        case reduce_op::MIN:
          acc[i] = value(std::min(a.real(), b.real()), 0);
          break;
        case reduce_op::MAX:
          acc[i] = value(std::max(a.real(), b.real()), 0);
          break;
        case reduce_op::BAND:
          acc[i] = value(static_cast<double>(ia & ib), 0);
          break;
        case reduce_op::BOR:
          acc[i] = value(static_cast<double>(ia | ib), 0);
          break;
        case reduce_op::BXOR:
          acc[i] = value(static_cast<double>(ia ^ ib), 0);
          break;
      }
    }
  if (k == reduce_op::AVG) {
    const double d = divisor > 0 ? divisor : static_cast<double>(inputs.size());
    for (auto& v : acc) v /= d;
  }
  // Round through the dtype so integer wrap-around and float rounding match.
  return read(make(t, acc));
}

inline double tolerance(dtype t) {
  switch (t) {
    case dtype::float16:
      return 1e-2;
    case dtype::bfloat16:
      return 2e-2;
    case dtype::float32:
    case dtype::complex64:
      return 1e-5;
    case dtype::float64:
    case dtype::complex128:
      return 1e-12;
    default:
      return 0;
  }
}

/// The first element of `got` (as read) not within the tolerance of `t` of
/// `expected` (NaN never is), or -1 when every one is.
inline std::int64_t first_mismatch(const values& got, const values& expected, dtype t) {
  const double tol = tolerance(t);
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] == expected[i]) continue;  // most are exact: no square roots for them
    const double err = std::abs(got[i] - expected[i]);
    if (!(err <= tol * std::max(1.0, std::abs(expected[i])))) return static_cast<std::int64_t>(i);
  }
  return -1;
}

/// Whether `got` holds `expected` within its dtype's tolerance (for forked
/// ranks, which report instead of asserting).
inline bool close(const tensor& got, const values& expected) {
  const auto g = read(got);
  return g.size() == expected.size() && first_mismatch(g, expected, got.scalar_type()) < 0;
}

/// Checks `got` against `expected` element by element (NaN never passes).
inline void check_close(const tensor& got, const values& expected, const std::string& what) {
  INFO(what);
  auto g = read(got);
  REQUIRE(g.size() == expected.size());
  if (const auto i = first_mismatch(g, expected, got.scalar_type()); i >= 0) {
    const auto k = static_cast<std::size_t>(i);
    FAIL_CHECK(what << ": element " << i << " is (" << g[k].real() << "," << g[k].imag()
                    << "), expected (" << expected[k].real() << "," << expected[k].imag() << ")");
  }
}

/// Concatenation of value lists.
inline values concat(const std::vector<values>& parts) {
  values r;
  for (auto& p : parts) r.insert(r.end(), p.begin(), p.end());
  return r;
}

inline values slice(const values& v, std::int64_t off, std::int64_t n) {
  return values(v.begin() + off, v.begin() + off + n);
}

}  // namespace ref
