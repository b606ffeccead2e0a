#include "inline/shm/direct_layout.hpp"

#include <numeric>

namespace troupe::detail {

std::int64_t direct_view::offset(int r) const {
  const auto& k = call.counts;
  return std::accumulate(k.begin(), k.begin() + r, std::int64_t{0}) * element_bytes;
}

std::int64_t direct_view::length(int r) const {
  return call.counts[static_cast<std::size_t>(r)] * element_bytes;
}

std::int64_t direct_view::total() const {
  return std::accumulate(call.counts.begin(), call.counts.end(), std::int64_t{0}) * element_bytes;
}

}  // namespace troupe::detail
