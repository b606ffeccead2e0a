// The CUDA runtime behind cuda/runtime.hpp and memory/device_memory.hpp, and the
// public device queries of troupe/device.hpp in CUDA builds.

#include "cuda/runtime.hpp"

#include <cuda_runtime.h>

#include <mutex>

#include "memory/device_memory.hpp"
#include "troupe/error.hpp"

namespace troupe {

namespace {

struct device_census {
  int count = 0;
  std::string status;
};

// Asked once per process: the answer does not change while it runs.
const device_census& census() {
  static const device_census c = [] {
    device_census r;
    int n = 0;
    auto e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();  // not sticky: leave no error behind for later calls
      r.status = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
      return r;
    }
    r.count = n;
    r.status = std::to_string(n) + " CUDA device" + (n == 1 ? "" : "s");
    return r;
  }();
  return c;
}

}  // namespace

bool cuda_built() noexcept {
  return true;
}
int cuda_device_count() noexcept {
  return census().count;
}
bool cuda_available() noexcept {
  return census().count > 0;
}
std::string cuda_status() {
  return census().status;
}

namespace detail::gpu {

void fail(const char* op, int device, const char* call, int code) {
  auto e = static_cast<cudaError_t>(code);
  throw error(errc::backend, std::string(op) + ": cuda:" + std::to_string(device) + ": " + call +
                                 " failed: " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) +
                                 ")");
}

void set_device(const char* op, int device) {
  check(op, device, "cudaSetDevice", cudaSetDevice(device));
}

stream_t create_stream(const char* op, int device) {
  set_device(op, device);
  cudaStream_t s = nullptr;
  check(op, device, "cudaStreamCreate", cudaStreamCreate(&s));
  return s;
}

void destroy_stream(int device, stream_t s) noexcept {
  if (!s) return;
  cudaSetDevice(device);
  cudaStreamDestroy(static_cast<cudaStream_t>(s));
}

void synchronize(const char* op, int device) {
  check(op, device, "cudaStreamSynchronize", cudaStreamSynchronize(0));
}

void synchronize_quietly(int device, stream_t s) noexcept {
  if (!s) return;
  cudaSetDevice(device);
  cudaStreamSynchronize(static_cast<cudaStream_t>(s));
}

event_t create_event(const char* op, int device) {
  set_device(op, device);
  cudaEvent_t e = nullptr;
  check(op, device, "cudaEventCreateWithFlags",
        cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void destroy_event(int device, event_t e) noexcept {
  if (!e) return;
  cudaSetDevice(device);
  cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

void record(const char* op, int device, event_t e, stream_t s) {
  check(op, device, "cudaEventRecord",
        cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)));
}

void wait_event(const char* op, int device, stream_t s, event_t e) {
  check(op, device, "cudaStreamWaitEvent",
        cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0));
}

bool event_done(const char* op, int device, event_t e) {
  auto r = cudaEventQuery(static_cast<cudaEvent_t>(e));
  if (r == cudaErrorNotReady) return false;
  check(op, device, "cudaEventQuery", r);
  return true;
}

void copy_async(const char* op, int device, void* dst, const void* src, std::size_t bytes,
                stream_t s) {
  if (bytes == 0 || dst == src) return;
  check(op, device, "cudaMemcpyAsync",
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(s)));
}

void on_host(const char* op, int device, stream_t s, void (*fn)(void*), void* arg) {
  check(op, device, "cudaLaunchHostFunc",
        cudaLaunchHostFunc(static_cast<cudaStream_t>(s), fn, arg));
}

void check_launch(const char* op, int device, const char* kernel) {
  auto e = cudaGetLastError();
  if (e != cudaSuccess) fail(op, device, kernel, e);
}

bool can_access_peer(int a, int b) {
  if (a == b) return true;
  int ok = 0;
  return cudaDeviceCanAccessPeer(&ok, a, b) == cudaSuccess && ok;
}

void enable_peer_access(const char* op, int a, int b) {
  if (a == b) return;
  set_device(op, a);
  auto e = cudaDeviceEnablePeerAccess(b, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return;
  }
  check(op, a, "cudaDeviceEnablePeerAccess", e);
}

int device_of(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
}

// -- memory/device_memory.hpp ---------------------------------------------------------

void check_device(const char* op, const device& d) {
  if (d.type != device_type::cuda) return;
  const auto& c = census();
  if (c.count == 0)
    throw error(errc::backend,
                std::string(op) + ": device " + to_string(d) + " is not usable: " + c.status);
  if (d.index < 0 || d.index >= c.count)
    throw error(errc::invalid_argument, std::string(op) + ": device " + to_string(d) +
                                            " does not exist (" + c.status + ")");
}

std::shared_ptr<void> allocate(const char* op, const device& d, std::size_t bytes) {
  check_device(op, d);
  set_device(op, d.index);
  void* p = nullptr;
  check(op, d.index, "cudaMalloc", cudaMalloc(&p, bytes ? bytes : 1));
  return std::shared_ptr<void>(p, [i = d.index](void* q) {
    cudaSetDevice(i);
    cudaFree(q);
  });
}

namespace {

int device_for(const void* a, const void* b) {
  auto d = device_of(a);
  return d >= 0 ? d : device_of(b);
}

}  // namespace

void copy(const char* op, void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  const int d = device_for(dst, src);
  if (d >= 0) set_device(op, d);
  // The legacy default stream: ordered after the user's work there; then wait,
  // so that the copy is complete when this returns (also device to device).
  check(op, d, "cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, 0));
  check(op, d, "cudaStreamSynchronize", cudaStreamSynchronize(0));
}

void zero(const char* op, const device& d, void* p, std::size_t bytes) {
  if (bytes == 0) return;
  set_device(op, d.index);
  check(op, d.index, "cudaMemsetAsync", cudaMemsetAsync(p, 0, bytes, 0));
  check(op, d.index, "cudaStreamSynchronize", cudaStreamSynchronize(0));
}

}  // namespace detail::gpu
}  // namespace troupe
