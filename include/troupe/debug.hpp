#pragma once
/// Environment settings: the debug level (TROUPE_DEBUG) and the node-local
/// rank (LOCAL_RANK).

#include <optional>

namespace troupe {

/// How much troupe checks and reports (c10d's TORCH_DISTRIBUTED_DEBUG).
enum class debug_level { off, info, detail };

/// Reads TROUPE_DEBUG: OFF, INFO or DETAIL in any letter case; unset or empty
/// means OFF. Any other value throws errc::invalid_argument naming the
/// variable, its value and the accepted values.
debug_level get_debug_level();
/// "OFF", "INFO", "DETAIL".
const char* to_string(debug_level l) noexcept;

/// The rank of this process on its node: LOCAL_RANK when set, else `fallback`
/// when given, else errc::invalid_argument naming LOCAL_RANK. A LOCAL_RANK
/// that is not a non-negative integer is an error naming its value.
int node_local_rank(std::optional<int> fallback = std::nullopt);

}  // namespace troupe
