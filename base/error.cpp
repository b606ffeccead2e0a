/// troupe::to_string(errc): short names for error codes.
#include "troupe/error.hpp"

#include "base/texts.hpp"

namespace troupe {

const char* to_string(errc code) noexcept {
  switch (code) {
    case errc::invalid_argument:
      return "invalid_argument";
    case errc::timeout:
      return "timeout";
    case errc::store:
      return "store";
    case errc::backend:
      return "backend";
    case errc::group:
      return "group";
    case errc::aborted:
      return "aborted";
    case errc::peer_failure:
      return "peer_failure";
    case errc::mismatch:
      return "mismatch";
    case errc::internal:
      return "internal";
  }
  return "unknown";
}

namespace detail {

void throw_invalid(const char* op, const std::string& why) {
  throw error(errc::invalid_argument, std::string(op) + ": " + why);
}

}  // namespace detail
}  // namespace troupe
