#pragma once
// Device memory as the rest of the library sees it: allocation, copies and
// fills of CUDA memory, behind plain pointers. Implemented in cuda/runtime.cpp
// in CUDA builds and by memory/device_memory_none.cpp (which refuses every call)
// otherwise, so that no CUDA header reaches code outside cuda/.
//
// Every function throws troupe::error(errc::backend) naming `op`, the device
// and the CUDA error string when a call fails.

#include <cstddef>
#include <memory>
#include <string>

#include "troupe/device.hpp"

namespace troupe::detail::gpu {

/// Throws errc::backend "OP: device cuda:N ..." unless `d` is a usable CUDA
/// device (a CUDA build, a driver, index < cuda_device_count()).
void check_device(const char* op, const device& d);
/// `bytes` of device memory on `d`, freed when the last owner goes away.
std::shared_ptr<void> allocate(const char* op, const device& d, std::size_t bytes);
/// Copies `bytes` between any two of host and device memory; returns once the
/// copy is complete. Ordered after work on the device's default stream.
void copy(const char* op, void* dst, const void* src, std::size_t bytes);
/// Sets `bytes` of device memory on `d` to zero; returns once done.
void zero(const char* op, const device& d, void* p, std::size_t bytes);

}  // namespace troupe::detail::gpu
