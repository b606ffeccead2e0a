// Device memory in a build without CUDA: no device exists, every call is refused.

#ifndef TROUPE_HAVE_CUDA

#include "memory/device_memory.hpp"

#include "troupe/error.hpp"

namespace troupe {

bool cuda_built() noexcept {
  return false;
}
int cuda_device_count() noexcept {
  return 0;
}
bool cuda_available() noexcept {
  return false;
}
std::string cuda_status() {
  return "troupe was built without CUDA";
}

namespace detail::gpu {

namespace {

[[noreturn]] void refuse(const char* op, const device& d) {
  throw error(errc::backend,
              std::string(op) + ": device " + to_string(d) + " needs a CUDA build of troupe");
}

}  // namespace

void check_device(const char* op, const device& d) {
  refuse(op, d);
}
std::shared_ptr<void> allocate(const char* op, const device& d, std::size_t) {
  refuse(op, d);
}
void copy(const char* op, void*, const void*, std::size_t) {
  throw error(errc::backend, std::string(op) + ": CUDA memory needs a CUDA build of troupe");
}
void zero(const char* op, const device& d, void*, std::size_t) {
  refuse(op, d);
}

}  // namespace detail::gpu
}  // namespace troupe

#endif
