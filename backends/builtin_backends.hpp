#pragma once
// The backends troupe registers itself (api/backend.cpp keeps the registry
// and adds these at its first use): a new built-in backend is one entry in
// builtin_backends.cpp.

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

/// The built-in backends by name: "actor", and "nccl" where built.
std::map<std::string, registry_entry> builtin_backends();

}  // namespace troupe::detail
