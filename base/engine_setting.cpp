#include "base/engine_setting.hpp"

#include <cstdlib>
#include <string>

#include "troupe/error.hpp"

namespace troupe::detail {

engine_setting read_engine_setting() {
  const char* value = std::getenv("TROUPE_ENGINE");
  const bool legacy = !value || !*value;  // TROUPE_FABRIC's on/off
  if (legacy) value = std::getenv("TROUPE_FABRIC");
  const std::string v = value ? value : "";
  if (v.empty() || v == "inline" || (legacy && v == "on")) return engine_setting::inline_engine;
  if (v == "actors" || (legacy && v == "off")) return engine_setting::actors;
  if (v == "messages") return engine_setting::messages;
  if (v == "staged") return engine_setting::staged;
  throw error(
      errc::invalid_argument,
      legacy ? "world: TROUPE_FABRIC '" + v + "' is not one of on, off, staged, messages"
             : "world: TROUPE_ENGINE '" + v + "' is not one of inline, messages, staged, actors");
}

std::string engine_setting_source() {
  for (const char* name : {"TROUPE_ENGINE", "TROUPE_FABRIC"})
    if (const char* v = std::getenv(name); v && *v) return std::string(name) + "=" + v;
  return {};
}

const char* to_string(engine_setting s) noexcept {
  switch (s) {
    case engine_setting::inline_engine:
      return "inline";
    case engine_setting::messages:
      return "messages";
    case engine_setting::staged:
      return "staged";
    case engine_setting::actors:
      return "actors";
  }
  return "?";
}

}  // namespace troupe::detail
