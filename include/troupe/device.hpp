#pragma once
/// Where a tensor's memory lives: the CPU or a CUDA device. A process group
/// dispatches each call to the backend registered for its tensors' device.

#include <string>

namespace troupe {

/// Kind of device.
enum class device_type : unsigned char { cpu, cuda };

/// A device: type plus index (index is 0 for the CPU).
struct device {
  device_type type = device_type::cpu;
  int index = 0;

  static device cpu() { return {}; }
  static device cuda(int index) { return {device_type::cuda, index}; }

  friend bool operator==(const device&, const device&) = default;
};

/// Whether this build of troupe has the CUDA path (CUDA was found at build time).
bool cuda_built() noexcept;
/// Number of CUDA devices this process can use: 0 in a build without CUDA,
/// without a driver or without a device (like torch.cuda.device_count()).
int cuda_device_count() noexcept;
/// cuda_device_count() > 0.
bool cuda_available() noexcept;
/// Why no device is usable ("troupe was built without CUDA", "cudaGetDeviceCount:
/// CUDA driver version is insufficient ..."), or "N CUDA device(s)".
std::string cuda_status();

/// "cpu" or "cuda".
const char* to_string(device_type t) noexcept;
/// "cpu" or "cuda:N".
std::string to_string(const device& d);

}  // namespace troupe
