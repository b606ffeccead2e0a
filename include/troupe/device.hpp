#pragma once
/// Where a tensor's memory lives. CPU now; CUDA devices are named so that a
/// process group can dispatch by device to the backend registered for it.

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

/// "cpu" or "cuda".
const char* to_string(device_type t) noexcept;
/// "cpu" or "cuda:N".
std::string to_string(const device& d);

}  // namespace troupe
