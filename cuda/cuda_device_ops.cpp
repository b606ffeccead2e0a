// device_ops on CUDA (see backends/device_ops.hpp).

#include "cuda/device_ops.hpp"
#include "cuda/runtime.hpp"
#include "troupe/error.hpp"

namespace troupe::detail::gpu {

namespace {

class cuda_ops final : public device_ops {
 public:
  event_t record_event(const char* op, int device, stream_t s) override {
    auto e = create_event(op, device);
    try {
      record(op, device, e, s);
    } catch (...) {
      gpu::destroy_event(device, e);
      throw;
    }
    return e;
  }
  void wait_event(const char* op, int device, stream_t s, event_t e) override {
    gpu::wait_event(op, device, s, e);
  }
  void destroy_event(int device, event_t e) noexcept override { gpu::destroy_event(device, e); }
  void reduce(const char* op, int device, const reduce_args& a, stream_t s) override {
    gpu::reduce(op, device, a, s);
  }
  void connect(const char* op, int a, int b) override {
    if (!can_access_peer(a, b))
      throw error(errc::invalid_argument,
                  std::string(op) + ": ranks of the group hold tensors on cuda:" +
                      std::to_string(a) + " and cuda:" + std::to_string(b) +
                      ", which cannot access each other's memory (use the nccl backend)");
    enable_peer_access(op, a, b);
  }
};

}  // namespace

device_ops& cuda_device_ops() {
  static cuda_ops ops;
  return ops;
}

}  // namespace troupe::detail::gpu
