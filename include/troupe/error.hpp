#pragma once
/// troupe::error — the one exception type the façade throws.
///
/// Inside the engine errors are values; at the public boundary they become a
/// troupe::error carrying a code (what kind of failure) and a message that
/// names the operation and the offending values.

#include <stdexcept>
#include <string>

namespace troupe {

/// What kind of failure an error reports.
enum class errc {
  invalid_argument,  ///< a caller passed a bad value (names op and value)
  timeout,           ///< a wait, store get or collective ran past its timeout
  store,             ///< a store operation failed for another reason
  backend,           ///< a backend is missing, unsupported or misconfigured
  group,             ///< a rank is not part of a group / group not registered
  aborted,           ///< the world was aborted (e.g. another rank failed)
  peer_failure,      ///< a peer rank left or died
  mismatch,          ///< ranks called different collectives at one sequence number
  internal,          ///< a bug in troupe
};

/// Returns a short name for an error code ("timeout", ...).
const char* to_string(errc code) noexcept;

/// The exception thrown by troupe's public API.
class error : public std::runtime_error {
 public:
  error(errc code, const std::string& what) : std::runtime_error(what), code_(code) {}
  /// What kind of failure this is.
  errc code() const noexcept { return code_; }

 private:
  errc code_;
};

}  // namespace troupe
