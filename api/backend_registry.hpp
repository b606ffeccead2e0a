#pragma once
// The backend registry's entry (api/backend.cpp keeps the registry; the
// built-in backends register themselves from backends/builtin_backends.cpp).

#include <map>
#include <string>
#include <vector>

#include "troupe/backend.hpp"

namespace troupe::detail {

/// How to make a registered backend, and the devices it serves.
struct registry_entry {
  backend_creator creator;
  std::vector<device_type> devices;
};

/// Registers the built-in backends ("actor", and "nccl" where built).
void register_builtin_backends(std::map<std::string, registry_entry>& entries);

}  // namespace troupe::detail
