// dtype sizes and names, float16/bfloat16 conversions, device names.

#include "troupe/dtype.hpp"

#include <string>

#include "half.hpp"
#include "troupe/device.hpp"

namespace troupe {

std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::bool_:
      return "bool";
    case dtype::uint8:
      return "uint8";
    case dtype::int8:
      return "int8";
    case dtype::int16:
      return "int16";
    case dtype::int32:
      return "int32";
    case dtype::int64:
      return "int64";
    case dtype::float16:
      return "float16";
    case dtype::bfloat16:
      return "bfloat16";
    case dtype::float32:
      return "float32";
    case dtype::float64:
      return "float64";
    case dtype::complex64:
      return "complex64";
    case dtype::complex128:
      return "complex128";
  }
  return "unknown";
}

bool is_floating_point(dtype t) noexcept {
  return t == dtype::float16 || t == dtype::bfloat16 || t == dtype::float32 || t == dtype::float64;
}

bool is_complex(dtype t) noexcept {
  return t == dtype::complex64 || t == dtype::complex128;
}

bool is_integral(dtype t) noexcept {
  return t == dtype::uint8 || t == dtype::int8 || t == dtype::int16 || t == dtype::int32 ||
         t == dtype::int64;
}

float16_t::float16_t(float f) noexcept : bits(detail::float_to_half_bits(f)) {}
float16_t::operator float() const noexcept {
  return detail::half_bits_to_float(bits);
}

bfloat16_t::bfloat16_t(float f) noexcept : bits(detail::float_to_bfloat16_bits(f)) {}
bfloat16_t::operator float() const noexcept {
  return detail::bfloat16_bits_to_float(bits);
}

const char* to_string(device_type t) noexcept {
  switch (t) {
    case device_type::cpu:
      return "cpu";
    case device_type::cuda:
      return "cuda";
  }
  return "unknown";
}

std::string to_string(const device& d) {
  if (d.type == device_type::cpu) return "cpu";
  return std::string(to_string(d.type)) + ":" + std::to_string(d.index);
}

}  // namespace troupe
