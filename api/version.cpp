// The library's version, as the build configured it (troupe/version.hpp).

#include "troupe/version.hpp"

namespace troupe {

const char* library_version() noexcept {
  return TROUPE_VERSION;
}

}  // namespace troupe
