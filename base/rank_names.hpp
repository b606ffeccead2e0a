#pragma once
// rank_names — how errors name the ranks of a group ("rank 2 (world rank
// 5)"): each name made when an error asks for it, by one description that
// the engines, media and mailbox of a rank share. A list of n names in each
// of them, in each of n ranks of a simulation, would be several n^2 strings.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace troupe::detail {

class rank_names {
 public:
  using describe_fn = std::function<std::string(int group_rank)>;
  /// No ranks.
  rank_names() = default;
  /// `size` ranks, named "rank r" until described otherwise.
  explicit rank_names(int size) : size_(static_cast<std::size_t>(size)) {}
  /// `size` ranks, named by `describe(r)`.
  rank_names(int size, describe_fn describe)
      : size_(static_cast<std::size_t>(size)),
        describe_(std::make_shared<const describe_fn>(std::move(describe))) {}
  /// These names.
  rank_names(std::vector<std::string> names)  // NOLINT: a list reads as its names
      : size_(names.size()),
        describe_(std::make_shared<const describe_fn>(
            [names = std::move(names)](int r) { return names[static_cast<std::size_t>(r)]; })) {}

  std::string operator[](std::size_t r) const {
    return describe_ ? (*describe_)(static_cast<int>(r)) : "rank " + std::to_string(r);
  }
  std::size_t size() const noexcept { return size_; }

 private:
  std::size_t size_ = 0;
  std::shared_ptr<const describe_fn> describe_;  // null: "rank r"
};

}  // namespace troupe::detail
