#pragma once
// The phrases every layer's errors share, written in one place: where a call
// ran, how a timeout reads, how a mismatch between ranks reads.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::detail {

/// "allreduce on group 'g' (rank 1, seq 3)": where a call ran; the rank
/// (when >= 0) and the sequence number (when not 0) are left out otherwise.
inline std::string call_location(const std::string& op, const std::string& group, int rank = -1,
                                 std::uint64_t seq = 0) {
  auto r = op + " on group '" + group + "'";
  if (rank < 0 && seq == 0) return r;
  r += " (";
  if (rank >= 0) r += "rank " + std::to_string(rank) + (seq != 0 ? ", " : "");
  if (seq != 0) r += "seq " + std::to_string(seq);
  return r + ")";
}

/// "rank 3 (...) left group 'g'", with " (why)" when `why` says how: how a
/// member that left is named to the calls that needed it.
inline std::string left_group(const std::string& name, const std::string& group,
                              const std::string& why = {}) {
  return name + " left group '" + group + "'" + (why.empty() ? "" : " (" + why + ")");
}

/// "Timed out after 300 ms": how every timeout message reads (c10d's and
/// torch's tests look for "Timed out"); a timeout that had expired before
/// the call (negative) reads as 0 ms.
inline std::string timeout_after(std::chrono::milliseconds t) {
  return "Timed out after " + std::to_string(t.count() > 0 ? t.count() : 0) + " ms";
}

/// "rank 3" or "ranks 1, 4": a list of ranks in a message.
inline std::string ranks_text(const std::vector<int>& rs) {
  std::string s = rs.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < rs.size(); ++i) s += (i ? ", " : "") + std::to_string(rs[i]);
  return s;
}

/// Throws errc::invalid_argument "OP: WHY", the form of every validation error.
[[noreturn]] void throw_invalid(const char* op, const std::string& why);

/// "collective mismatch: <why>": how every disagreement between ranks reads.
inline std::string mismatch_text(const std::string& why) {
  return "collective mismatch: " + why;
}

}  // namespace troupe::detail
