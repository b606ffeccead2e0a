#pragma once
// small_vector — a fixed number of trivially copyable elements (pointers, one
// per rank) kept without allocating while there are at most N of them: a
// small collective needs one such list per call, and an allocation per call
// is a good part of a call that takes a microsecond.

#include <array>
#include <cstddef>
#include <type_traits>
#include <vector>

namespace troupe::detail {

template <class T, std::size_t N>
class small_vector {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  /// `n` value-initialized elements.
  explicit small_vector(std::size_t n) : n_(n) {
    if (n > N) heap_.resize(n);
  }
  T* data() noexcept { return n_ > N ? heap_.data() : inline_.data(); }
  const T* data() const noexcept { return n_ > N ? heap_.data() : inline_.data(); }
  std::size_t size() const noexcept { return n_; }
  T& operator[](std::size_t i) noexcept { return data()[i]; }
  const T& operator[](std::size_t i) const noexcept { return data()[i]; }

 private:
  std::size_t n_;
  std::array<T, N> inline_{};
  std::vector<T> heap_;
};

}  // namespace troupe::detail
