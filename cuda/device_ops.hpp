#pragma once
// device_ops — what the device exchange asks of a device: events that order
// the ranks' streams, the reduction kernel, and access between devices. The
// CUDA implementation is cuda_device_ops() (cuda/cuda_device_ops.cpp); the
// tests run the exchange on host memory with one of their own.

#include "cuda/kernels.hpp"
#include "cuda/stream.hpp"

namespace troupe::detail::gpu {

class device_ops {
 public:
  virtual ~device_ops() = default;
  /// A new event recorded on `s` (everything issued there before it).
  virtual event_t record_event(const char* op, int device, stream_t s) = 0;
  /// Work issued on `s` after this waits for `e`.
  virtual void wait_event(const char* op, int device, stream_t s, event_t e) = 0;
  virtual void destroy_event(int device, event_t e) noexcept = 0;
  /// Issues the element-wise reduction `a` on `s` (gpu::reduce).
  virtual void reduce(const char* op, int device, const reduce_args& a, stream_t s) = 0;
  /// Lets kernels on device `a` reach memory of device `b`; throws
  /// errc::invalid_argument naming both when they cannot.
  virtual void connect(const char* op, int a, int b) = 0;
};

/// The CUDA devices (CUDA builds only).
device_ops& cuda_device_ops();

}  // namespace troupe::detail::gpu
