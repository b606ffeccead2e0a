#include "troupe/debug.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "troupe/error.hpp"

namespace troupe {

debug_level get_debug_level() {
  const char* raw = std::getenv("TROUPE_DEBUG");
  if (!raw || !*raw) return debug_level::off;
  std::string v{raw};
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::toupper(c); });
  if (v == "OFF") return debug_level::off;
  if (v == "INFO") return debug_level::info;
  if (v == "DETAIL") return debug_level::detail;
  throw error(errc::invalid_argument, std::string("TROUPE_DEBUG has the invalid value '") + raw +
                                          "'; accepted values are OFF, INFO and DETAIL (any case)");
}

const char* to_string(debug_level l) noexcept {
  switch (l) {
    case debug_level::off:
      return "OFF";
    case debug_level::info:
      return "INFO";
    case debug_level::detail:
      return "DETAIL";
  }
  return "?";
}

int node_local_rank(std::optional<int> fallback) {
  const char* raw = std::getenv("LOCAL_RANK");
  if (!raw) {
    if (fallback) return *fallback;
    throw error(errc::invalid_argument,
                "node_local_rank: LOCAL_RANK is not set in the environment and no fallback was "
                "given; set LOCAL_RANK (e.g. through the launcher) or pass a fallback");
  }
  std::string v{raw};
  std::size_t used = 0;
  long r = -1;
  try {
    r = std::stol(v, &used);
  } catch (...) {
    used = 0;
  }
  if (used != v.size() || v.empty() || r < 0 || r > 1'000'000)
    throw error(errc::invalid_argument,
                "node_local_rank: LOCAL_RANK='" + v + "' is not a non-negative integer");
  return static_cast<int>(r);
}

}  // namespace troupe
