#pragma once
/// Element types of tensors, with their sizes and names.

#include <complex>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace troupe {

/// The element type of a tensor.
enum class dtype : std::uint8_t {
  bool_,
  uint8,
  int8,
  int16,
  int32,
  int64,
  float16,
  bfloat16,
  float32,
  float64,
  complex64,
  complex128,
};

/// Number of dtypes (for iteration in tests and tables).
inline constexpr int dtype_count = 12;

/// Size in bytes of one element (inline: every call asks it, some many times).
constexpr std::size_t element_size(dtype t) noexcept {
  switch (t) {
    case dtype::bool_:
    case dtype::uint8:
    case dtype::int8:
      return 1;
    case dtype::int16:
    case dtype::float16:
    case dtype::bfloat16:
      return 2;
    case dtype::int32:
    case dtype::float32:
      return 4;
    case dtype::int64:
    case dtype::float64:
    case dtype::complex64:
      return 8;
    case dtype::complex128:
      return 16;
  }
  return 0;
}
/// Name as PyTorch spells it without the prefix ("float32", "bool", ...).
std::string_view to_string(dtype t) noexcept;
/// float16, bfloat16, float32, float64.
bool is_floating_point(dtype t) noexcept;
/// complex64, complex128.
bool is_complex(dtype t) noexcept;
/// uint8 ... int64 (bool excluded).
bool is_integral(dtype t) noexcept;

/// IEEE binary16, stored as bits; converts to and from float.
struct float16_t {
  std::uint16_t bits = 0;
  float16_t() = default;
  explicit float16_t(float f) noexcept;
  explicit operator float() const noexcept;
  friend bool operator==(float16_t a, float16_t b) noexcept { return a.bits == b.bits; }
};

/// bfloat16 (upper half of a float32), stored as bits; converts to and from float.
struct bfloat16_t {
  std::uint16_t bits = 0;
  bfloat16_t() = default;
  explicit bfloat16_t(float f) noexcept;
  explicit operator float() const noexcept;
  friend bool operator==(bfloat16_t a, bfloat16_t b) noexcept { return a.bits == b.bits; }
};

/// Maps a C++ element type to its dtype: dtype_of<float> == dtype::float32.
template <class T>
struct dtype_traits;
#define TROUPE_DTYPE_TRAIT(T, D)             \
  template <>                                \
  struct dtype_traits<T> {                   \
    static constexpr dtype value = dtype::D; \
  };
TROUPE_DTYPE_TRAIT(bool, bool_)
TROUPE_DTYPE_TRAIT(std::uint8_t, uint8)
TROUPE_DTYPE_TRAIT(std::int8_t, int8)
TROUPE_DTYPE_TRAIT(std::int16_t, int16)
TROUPE_DTYPE_TRAIT(std::int32_t, int32)
TROUPE_DTYPE_TRAIT(std::int64_t, int64)
TROUPE_DTYPE_TRAIT(float16_t, float16)
TROUPE_DTYPE_TRAIT(bfloat16_t, bfloat16)
TROUPE_DTYPE_TRAIT(float, float32)
TROUPE_DTYPE_TRAIT(double, float64)
TROUPE_DTYPE_TRAIT(std::complex<float>, complex64)
TROUPE_DTYPE_TRAIT(std::complex<double>, complex128)
#undef TROUPE_DTYPE_TRAIT

template <class T>
inline constexpr dtype dtype_of = dtype_traits<T>::value;

}  // namespace troupe
