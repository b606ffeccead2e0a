#pragma once
// arrival_queue — a list in arrival order that is searched from the front
// and mostly taken from the front (a mailbox's waiting messages and posted
// receives). A vector whose taken front is skipped, not closed up: a backlog
// of n taken in order costs O(1) a take, where a vector's erase at the front
// moves all n - 1 behind it. The skipped front is dropped once it is as long
// as what follows it (one move of each element at most once per halving),
// and the storage is kept for the next arrivals.

#include <cstddef>
#include <utility>
#include <vector>

namespace troupe::detail {

template <class T>
class arrival_queue {
 public:
  using iterator = typename std::vector<T>::iterator;

  iterator begin() noexcept { return items_.begin() + static_cast<std::ptrdiff_t>(head_); }
  iterator end() noexcept { return items_.end(); }
  bool empty() const noexcept { return head_ == items_.size(); }
  std::size_t size() const noexcept { return items_.size() - head_; }
  T& back() { return items_.back(); }
  void push_back(T v) { items_.push_back(std::move(v)); }

  /// Removes `i`; returns the element after it. The first one is released
  /// (assigned T{}) and skipped; one further in is closed up behind.
  iterator erase(iterator i) {
    if (i != begin()) return items_.erase(i);
    *i = T{};
    if (++head_ == items_.size()) {
      clear();
    } else if (head_ >= min_dropped && head_ * 2 >= items_.size()) {
      items_.erase(items_.begin(), begin());
      head_ = 0;
    }
    return begin();
  }
  void clear() noexcept {
    items_.clear();
    head_ = 0;
  }

 private:
  static constexpr std::size_t min_dropped = 32;
  std::vector<T> items_;
  std::size_t head_ = 0;  // items_[0, head_) were taken
};

}  // namespace troupe::detail
