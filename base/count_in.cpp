// count_in (base/count_in.hpp): one key counted, one key waited for.

#include "base/count_in.hpp"

#include "base/texts.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

void count_in(store& s, const std::string& key, int rank, int size,
              std::chrono::milliseconds timeout, const std::string& op, const std::string& what) {
  auto member_key = [&](int r) { return key + "/rank/" + std::to_string(r); };
  // The member's own key first: at a timeout it tells who never came.
  s.set(member_key(rank), to_bytes("1"));
  if (s.add(key, 1) >= size) s.set(key + "/all", to_bytes("1"));
  try {
    s.wait({key + "/all"}, timeout);
  } catch (const error& e) {
    if (e.code() != errc::timeout) throw;
    std::string missing;
    int count = 0;
    for (int r = 0; r < size; ++r)
      if (!s.check({member_key(r)})) missing += (count++ ? ", " : "") + std::to_string(r);
    if (count == 0) return;  // they came at the last moment
    throw error(errc::timeout, op + ": " + timeout_after(timeout) + " waiting for " +
                                   (count == 1 ? "rank " : "ranks ") + missing + " to " + what);
  }
}

}  // namespace troupe::detail
