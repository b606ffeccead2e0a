#include "inline/shm/direct_layout.hpp"

namespace troupe::detail {

std::int64_t direct_view::offset(int r) const {
  return prefix[r] * element_bytes;
}

std::int64_t direct_view::length(int r) const {
  return call.counts[static_cast<std::size_t>(r)] * element_bytes;
}

std::int64_t direct_view::total() const {
  return prefix[size] * element_bytes;
}

std::vector<std::int64_t> count_prefix(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> p(counts.size() + 1, 0);
  for (std::size_t i = 0; i < counts.size(); ++i) p[i + 1] = p[i] + counts[i];
  return p;
}

}  // namespace troupe::detail
