// The members of a group that left, and how ("its world ended", "it left the
// job after ..."): what a group actor and a mailbox keep to fail the calls
// that need such a member. Every rank of a large world leaving tells every
// other, so this holds one small index per member, into the few distinct
// texts, and the text that names the member is made only when a call needs it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::detail {

/// How long calls wait on after a member was first found crashed before they
/// fail, naming every member found crashed by then: a rank that failed
/// because another died may end (without a goodbye) before this rank's
/// reader saw the first death, which must not go unnamed.
inline constexpr std::chrono::milliseconds crash_grace{50};

class gone_peers {
 public:
  /// Group rank `peer` of `size` left, and `why`; false when known already.
  bool add(int peer, int size, const std::string& why) {
    if (peer < 0 || peer >= size || this->why(peer)) return false;
    const auto k = std::find(whys_.begin(), whys_.end(), why) - whys_.begin();
    if (static_cast<std::size_t>(k) == whys_.size()) whys_.push_back(why);
    index_.resize(static_cast<std::size_t>(size), -1);  // at the first that leaves
    index_[static_cast<std::size_t>(peer)] = static_cast<std::int32_t>(k);
    return true;
  }
  /// How group rank `peer` left, or null while it is here.
  const std::string* why(int peer) const {
    if (peer < 0 || static_cast<std::size_t>(peer) >= index_.size()) return nullptr;
    const auto k = index_[static_cast<std::size_t>(peer)];
    return k < 0 ? nullptr : &whys_[static_cast<std::size_t>(k)];
  }

 private:
  std::vector<std::int32_t> index_;  // by group rank: into whys_, -1 while here
  std::vector<std::string> whys_;    // the distinct texts
};

}  // namespace troupe::detail
