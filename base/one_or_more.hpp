#pragma once
// one_or_more — a list that mostly holds one element: the first is kept
// without allocating, the rest in a vector. What one step of an engine or a
// mailbox finished is such a list, built once per call.

#include <optional>
#include <utility>
#include <vector>

namespace troupe::detail {

template <class T>
class one_or_more {
 public:
  void push_back(T v) {
    if (!one_)
      one_.emplace(std::move(v));
    else
      more_.push_back(std::move(v));
  }
  /// As push_back, built in place (no move of the element).
  template <class... A>
  void emplace_back(A&&... args) {
    if (!one_)
      one_.emplace(std::forward<A>(args)...);
    else
      more_.emplace_back(std::forward<A>(args)...);
  }
  bool empty() const noexcept { return !one_; }
  template <class F>
  void for_each(F&& fn) {
    if (one_) fn(*one_);
    for (auto& v : more_) fn(v);
  }

 private:
  std::optional<T> one_;
  std::vector<T> more_;
};

}  // namespace troupe::detail
