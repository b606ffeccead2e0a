// The backends troupe registers itself: "actor" (host_backend, for cpu and
// cuda tensors) and, in builds with NCCL, "nccl" for cuda tensors
// ("cpu:actor,cuda:nccl").

#include "backends/builtin_backends.hpp"

#include <memory>

#include "backends/host_backend.hpp"
#ifdef TROUPE_HAVE_NCCL
#include "backends/nccl_backend.hpp"
#endif

namespace troupe::detail {

std::map<std::string, registry_entry> builtin_backends() {
  std::map<std::string, registry_entry> entries;
  entries.emplace("actor",
                  registry_entry{[](const backend_context& ctx) -> std::shared_ptr<backend> {
                                   return std::make_shared<host_backend>(ctx);
                                 },
                                 {device_type::cpu, device_type::cuda}});
#ifdef TROUPE_HAVE_NCCL
  entries.emplace("nccl",
                  registry_entry{[](const backend_context& ctx) { return make_nccl_backend(ctx); },
                                 {device_type::cuda}});
#endif
  return entries;
}

}  // namespace troupe::detail
