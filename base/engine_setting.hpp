#pragma once
// TROUPE_ENGINE: which engines the groups of a process run their calls on.
// Read in one place; TROUPE_FABRIC, its former name, is read where
// TROUPE_ENGINE is unset (its values on/off mean inline/actors), for one
// release (CHANGELOG.md).

#include <string>

namespace troupe::detail {

enum class engine_setting {
  /// "inline" (the default): CPU collectives on the inline engine, over the
  /// shared segment where every rank shares the host, else as messages.
  inline_engine,
  /// "messages": the inline engine without the shared segment (every
  /// collective as messages, as between hosts; for tests and comparisons).
  messages,
  /// "staged": the shared segment, with ranks of one process staging
  /// through it as if they were apart.
  staged,
  /// "actors": every call through the group actors (collectives and point
  /// to point), no inline engine.
  actors,
};

/// The setting of this process's environment; throws errc::invalid_argument
/// naming the variable and its value when it is none of the above.
engine_setting read_engine_setting();
/// "inline", "messages", "staged", "actors".
const char* to_string(engine_setting s) noexcept;
/// The variable that chose the setting, as the environment says it
/// ("TROUPE_ENGINE=actors", "TROUPE_FABRIC=off"; "" when neither is set),
/// for messages that name what the user set.
std::string engine_setting_source();

}  // namespace troupe::detail
