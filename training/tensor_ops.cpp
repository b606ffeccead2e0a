#include "training/tensor_ops.hpp"

#include <complex>
#include <cstring>
#include <utility>

#include "base/half.hpp"
#include "training/half_cast.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

namespace {

[[noreturn]] void refuse(const char* op, const std::string& what) {
  throw error(errc::invalid_argument, std::string(op) + ": " + what);
}

void check_host_contiguous(const char* op, const tensor& t) {
  if (!t.defined()) refuse(op, "undefined tensor");
  if (!t.is_contiguous()) refuse(op, "expected a contiguous tensor, got " + t.describe());
}

/// Runs `fn` on a host tensor with t's contents; writes it back when t lives on a device.
template <class F>
void on_host(tensor t, bool write_back, F&& fn) {
  if (t.is_cpu()) {
    fn(t);
    return;
  }
  auto host = tensor::empty(t.shape(), t.scalar_type());
  host.copy_from(t);
  fn(host);
  if (write_back) t.copy_from(host);
}

/// Reads element i of a floating buffer as double / float.
template <class T>
inline float load_float(const T* p, std::int64_t i) {
  if constexpr (std::is_same_v<T, float16_t>)
    return half_bits_to_float(p[i].bits);
  else if constexpr (std::is_same_v<T, bfloat16_t>)
    return bfloat16_bits_to_float(p[i].bits);
  else
    return static_cast<float>(p[i]);
}

template <class T>
inline void store_float(T* p, std::int64_t i, float v) {
  if constexpr (std::is_same_v<T, float16_t>)
    p[i].bits = float_to_half_bits(v);
  else if constexpr (std::is_same_v<T, bfloat16_t>)
    p[i].bits = float_to_bfloat16_bits(v);
  else
    p[i] = static_cast<T>(v);
}

/// Calls fn(T{}) with the C++ type of floating dtype `t`.
template <class F>
void visit_float(const char* op, dtype t, F&& fn) {
  switch (t) {
    case dtype::float16:
      return fn(float16_t{});
    case dtype::bfloat16:
      return fn(bfloat16_t{});
    case dtype::float32:
      return fn(float{});
    case dtype::float64:
      return fn(double{});
    default:
      refuse(op, "expected a floating dtype (float16, bfloat16, float32, float64), got " +
                     std::string(to_string(t)));
  }
}

template <class D, class S>
void cast_loop(D* d, const S* s, std::int64_t n, double scale) {
  // float32 <-> float16 / bfloat16: vectorised (compression hooks cast whole buckets).
  auto* d16 = reinterpret_cast<std::uint16_t*>(d);
  const auto* s16 = reinterpret_cast<const std::uint16_t*>(s);
  if constexpr (std::is_same_v<D, float16_t> && std::is_same_v<S, float>) {
    float_to_half(s, d16, n, static_cast<float>(scale));
  } else if constexpr (std::is_same_v<D, bfloat16_t> && std::is_same_v<S, float>) {
    float_to_bfloat16(s, d16, n, static_cast<float>(scale));
  } else if constexpr (std::is_same_v<D, float> && std::is_same_v<S, float16_t>) {
    half_to_float(s16, d, n);
    if (scale != 1.0)
      for (std::int64_t i = 0; i < n; ++i) d[i] *= static_cast<float>(scale);
  } else if constexpr (std::is_same_v<D, float> && std::is_same_v<S, bfloat16_t>) {
    bfloat16_to_float(s16, d, n);
    if (scale != 1.0)
      for (std::int64_t i = 0; i < n; ++i) d[i] *= static_cast<float>(scale);
  } else if constexpr (std::is_same_v<D, double> && std::is_same_v<S, double>) {
    for (std::int64_t i = 0; i < n; ++i) d[i] = s[i] * scale;
  } else if constexpr (std::is_same_v<D, double>) {
    for (std::int64_t i = 0; i < n; ++i) d[i] = static_cast<double>(load_float(s, i)) * scale;
  } else if constexpr (std::is_same_v<S, double>) {
    for (std::int64_t i = 0; i < n; ++i) store_float(d, i, static_cast<float>(s[i] * scale));
  } else {
    const auto f = static_cast<float>(scale);
    if (f == 1.0f)
      for (std::int64_t i = 0; i < n; ++i) store_float(d, i, load_float(s, i));
    else
      for (std::int64_t i = 0; i < n; ++i) store_float(d, i, load_float(s, i) * f);
  }
}

}  // namespace

bool is_training_float(dtype t) noexcept {
  return t == dtype::float16 || t == dtype::bfloat16 || t == dtype::float32 || t == dtype::float64;
}

std::string shape_string(const shape_t& shape) {
  std::string r = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) r += (i ? ", " : "") + std::to_string(shape[i]);
  return r + "]";
}

void cast_scaled(const char* op, tensor dst, const tensor& src, double scale) {
  check_host_contiguous(op, dst);
  check_host_contiguous(op, src);
  if (dst.numel() != src.numel())
    refuse(op, "cannot cast " + src.describe() + " into " + dst.describe() + " (numel differs)");
  if (dst.scalar_type() == src.scalar_type() && scale == 1.0) {
    if (!dst.is_same(src)) dst.copy_from(src);
    return;
  }
  on_host(src, false, [&](const tensor& s) {
    on_host(dst, true, [&](const tensor& d) {
      visit_float(op, d.scalar_type(), [&](auto dt) {
        using D = decltype(dt);
        visit_float(op, s.scalar_type(), [&](auto st) {
          using S = decltype(st);
          cast_loop(d.data_as<D>(), s.data_as<S>(), d.numel(), scale);
        });
      });
    });
  });
}

tensor cast_copy(const char* op, const tensor& src, dtype to, double scale) {
  auto r = tensor::empty(src.shape(), to);
  cast_scaled(op, r, src, scale);
  return r;
}

void scale_inplace(const char* op, tensor t, double scale) {
  check_host_contiguous(op, t);
  if (scale == 1.0) return;
  on_host(t, true, [&](const tensor& h) {
    const auto n = h.numel();
    if (h.scalar_type() == dtype::complex64) {
      auto* p = h.data_as<std::complex<float>>();
      for (std::int64_t i = 0; i < n; ++i) p[i] *= static_cast<float>(scale);
      return;
    }
    if (h.scalar_type() == dtype::complex128) {
      auto* p = h.data_as<std::complex<double>>();
      for (std::int64_t i = 0; i < n; ++i) p[i] *= scale;
      return;
    }
    visit_float(op, h.scalar_type(), [&](auto tt) {
      using T = decltype(tt);
      cast_loop(h.data_as<T>(), h.data_as<T>(), n, scale);
    });
  });
}

void add_inplace(const char* op, tensor dst, const tensor& src) {
  check_host_contiguous(op, dst);
  check_host_contiguous(op, src);
  if (dst.numel() != src.numel() || dst.scalar_type() != src.scalar_type())
    refuse(op, "cannot add " + src.describe() + " to " + dst.describe());
  on_host(src, false, [&](const tensor& s) {
    on_host(dst, true, [&](const tensor& d) {
      visit_float(op, d.scalar_type(), [&](auto tt) {
        using T = decltype(tt);
        auto* a = d.data_as<T>();
        const auto* b = s.data_as<T>();
        const auto n = d.numel();
        for (std::int64_t i = 0; i < n; ++i) {
          if constexpr (std::is_same_v<T, double>)
            a[i] += b[i];
          else
            store_float(a, i, load_float(a, i) + load_float(b, i));
        }
      });
    });
  });
}

void subtract_into(const char* op, tensor dst, const tensor& a, const tensor& b) {
  check_host_contiguous(op, dst);
  check_host_contiguous(op, a);
  check_host_contiguous(op, b);
  if (dst.numel() != a.numel() || dst.numel() != b.numel() ||
      dst.scalar_type() != a.scalar_type() || dst.scalar_type() != b.scalar_type())
    refuse(op,
           "cannot subtract " + b.describe() + " from " + a.describe() + " into " + dst.describe());
  on_host(a, false, [&](const tensor& ha) {
    on_host(b, false, [&](const tensor& hb) {
      on_host(dst, true, [&](const tensor& d) {
        visit_float(op, d.scalar_type(), [&](auto tt) {
          using T = decltype(tt);
          auto* r = d.data_as<T>();
          const auto* x = ha.data_as<T>();
          const auto* y = hb.data_as<T>();
          const auto n = d.numel();
          for (std::int64_t i = 0; i < n; ++i) {
            if constexpr (std::is_same_v<T, double>)
              r[i] = x[i] - y[i];
            else
              store_float(r, i, load_float(x, i) - load_float(y, i));
          }
        });
      });
    });
  });
}

tensor zeros_like(const tensor& t) {
  return tensor::zeros(t.shape(), t.scalar_type(), t.get_device());
}

}  // namespace troupe::detail
