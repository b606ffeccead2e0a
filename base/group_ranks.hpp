// A group's world ranks (group rank i is world rank global_ranks[i]) looked
// up the other way: which group rank a world rank is.
#pragma once

#include <algorithm>
#include <vector>

namespace troupe::detail {

/// The group rank of world rank `w`, or -1 when it is not a member: O(1)
/// where group ranks are world ranks (the default group, a group of every
/// rank), O(log n) where `sorted` (ascending, as new_group keeps them),
/// else O(n). Every rank of a large world hears of every other leaving: a
/// linear search there made tearing down n ranks cost n^3.
inline int group_rank_of(const std::vector<int>& global_ranks, bool sorted, int w) {
  const auto& rs = global_ranks;
  if (w >= 0 && static_cast<std::size_t>(w) < rs.size() && rs[static_cast<std::size_t>(w)] == w)
    return w;
  auto i = sorted ? std::lower_bound(rs.begin(), rs.end(), w) : std::find(rs.begin(), rs.end(), w);
  return i != rs.end() && *i == w ? static_cast<int>(i - rs.begin()) : -1;
}

}  // namespace troupe::detail
