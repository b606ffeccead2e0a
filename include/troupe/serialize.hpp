#pragma once
/// Binary serialization for object collectives, driven by the CAF inspect
/// convention: a type opts in with a free function found by ADL,
///
///   struct point { int x; double y; std::string label; };
///   template <class Inspector>
///   auto inspect(Inspector& f, point& p) { return f(p.x, p.y, p.label); }
///
/// Built in: arithmetic types, enums, std::string, std::vector, std::array,
/// std::pair, std::map, std::optional, troupe::tensor (CPU), and any
/// nesting of these. A type that is none of these and has no inspect overload
/// fails to compile with a static_assert naming the requirement.

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/tensor.hpp"

namespace troupe {

class binary_writer;
class binary_reader;

namespace detail {
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T>
struct is_map : std::false_type {};
template <class K, class V, class C, class A>
struct is_map<std::map<K, V, C, A>> : std::true_type {};
template <class T>
struct is_pair : std::false_type {};
template <class A, class B>
struct is_pair<std::pair<A, B>> : std::true_type {};
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_array : std::false_type {};
template <class T, std::size_t N>
struct is_array<std::array<T, N>> : std::true_type {};

template <class Inspector, class T>
concept inspectable = requires(Inspector& f, T& x) {
  inspect(f, x);
};

/// Whether T can be written by binary_writer (checked recursively at use).
template <class T>
inline constexpr bool builtin_serializable =
    std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_same_v<T, std::string> ||
    std::is_same_v<T, tensor> || is_vector<T>::value || is_map<T>::value || is_pair<T>::value ||
    is_optional<T>::value || is_array<T>::value;
}  // namespace detail

/// Writes values into a byte buffer.
class binary_writer {
 public:
  using result_type = void;
  static constexpr bool reads_state = true;
  static constexpr bool writes_state = false;

  template <class... Ts>
  void operator()(Ts&&... xs) {
    (apply(xs), ...);
  }
  std::vector<std::uint8_t>& bytes() noexcept { return buf_; }

  template <class T>
  void apply(const T& x) {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_arithmetic_v<U> || std::is_enum_v<U>) {
      raw(&x, sizeof(U));
    } else if constexpr (std::is_same_v<U, std::string>) {
      size(x.size());
      raw(x.data(), x.size());
    } else if constexpr (std::is_same_v<U, tensor>) {
      write_tensor(x);
    } else if constexpr (detail::is_vector<U>::value || detail::is_map<U>::value) {
      size(x.size());
      for (auto& e : x) apply(e);
    } else if constexpr (detail::is_array<U>::value) {
      for (auto& e : x) apply(e);
    } else if constexpr (detail::is_pair<U>::value) {
      apply(x.first);
      apply(x.second);
    } else if constexpr (detail::is_optional<U>::value) {
      apply(x.has_value());
      if (x) apply(*x);
    } else {
      static_assert(detail::inspectable<binary_writer, U>,
                    "troupe: this type cannot be serialized: give it a free function "
                    "`template <class Inspector> auto inspect(Inspector& f, T& x) { return "
                    "f(x.member1, x.member2); }` (the CAF inspect convention)");
      inspect(*this, const_cast<U&>(x));
    }
  }

 private:
  void size(std::size_t n) {
    auto v = static_cast<std::uint64_t>(n);
    raw(&v, sizeof(v));
  }
  void raw(const void* p, std::size_t n) {
    auto* b = static_cast<const std::uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  void write_tensor(const tensor& t);
  std::vector<std::uint8_t> buf_;
};

/// Reads values back from a byte buffer; truncated or malformed input throws
/// errc::invalid_argument.
class binary_reader {
 public:
  using result_type = void;
  static constexpr bool reads_state = false;
  static constexpr bool writes_state = true;

  explicit binary_reader(const std::vector<std::uint8_t>& bytes) : buf_(bytes) {}

  template <class... Ts>
  void operator()(Ts&&... xs) {
    (apply(xs), ...);
  }
  bool at_end() const noexcept { return pos_ == buf_.size(); }

  template <class T>
  void apply(T& x) {
    if constexpr (std::is_same_v<T, bool>) {
      std::uint8_t b = 0;
      raw(&b, 1);
      if (b > 1) malformed("bool byte out of range");
      x = b != 0;
    } else if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>) {
      raw(&x, sizeof(T));
    } else if constexpr (std::is_same_v<T, std::string>) {
      auto n = size(1);
      x.resize(n);
      raw(x.data(), n);
    } else if constexpr (std::is_same_v<T, tensor>) {
      x = read_tensor();
    } else if constexpr (detail::is_vector<T>::value) {
      auto n = size(1);
      x.clear();
      x.resize(n);
      for (auto& e : x) apply(e);
    } else if constexpr (detail::is_map<T>::value) {
      auto n = size(1);
      x.clear();
      for (std::size_t i = 0; i < n; ++i) {
        typename T::key_type k{};
        typename T::mapped_type v{};
        apply(k);
        apply(v);
        x.emplace(std::move(k), std::move(v));
      }
    } else if constexpr (detail::is_array<T>::value) {
      for (auto& e : x) apply(e);
    } else if constexpr (detail::is_pair<T>::value) {
      apply(x.first);
      apply(x.second);
    } else if constexpr (detail::is_optional<T>::value) {
      bool has = false;
      apply(has);
      if (has) {
        typename T::value_type v{};
        apply(v);
        x = std::move(v);
      } else {
        x.reset();
      }
    } else {
      static_assert(detail::inspectable<binary_reader, T>,
                    "troupe: this type cannot be deserialized: give it an inspect overload");
      inspect(*this, x);
    }
  }

 private:
  std::size_t size(std::size_t min_element_bytes) {
    std::uint64_t n = 0;
    raw(&n, sizeof(n));
    if (n > (buf_.size() - pos_) / std::max<std::size_t>(min_element_bytes, 1) + 1)
      malformed("length " + std::to_string(n) + " exceeds the remaining input");
    return static_cast<std::size_t>(n);
  }
  void raw(void* p, std::size_t n) {
    if (n > buf_.size() - pos_) malformed("truncated input");
    if (n) std::memcpy(p, buf_.data() + pos_, n);
    pos_ += n;
  }
  [[noreturn]] void malformed(const std::string& why) {
    throw error(errc::invalid_argument, "deserialize: " + why + " at byte " + std::to_string(pos_));
  }
  tensor read_tensor();
  const std::vector<std::uint8_t>& buf_;
  std::size_t pos_ = 0;
};

/// Serializes `x` into bytes.
template <class T>
std::vector<std::uint8_t> serialize(const T& x) {
  binary_writer w;
  w.apply(x);
  return std::move(w.bytes());
}

/// Deserializes bytes made by serialize<T>; trailing bytes are an error.
template <class T>
T deserialize(const std::vector<std::uint8_t>& bytes) {
  binary_reader r{bytes};
  T x{};
  r.apply(x);
  if (!r.at_end())
    throw error(errc::invalid_argument,
                "deserialize: " + std::to_string(bytes.size()) + " bytes hold more than one value");
  return x;
}

}  // namespace troupe
