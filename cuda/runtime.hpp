#pragma once
// The CUDA runtime as troupe's GPU code uses it: streams, events, async
// copies and host callbacks behind opaque handles, so that headers outside
// cuda/*.cu and cuda/*.cpp never include a CUDA header.
//
// Every call that fails throws troupe::error(errc::backend) with the message
// "OP: cuda:N: CALL failed: ERROR STRING (cudaErrorName)": the troupe call,
// the device, the CUDA call and CUDA's own words.

#include <cstddef>
#include <string>

#include "cuda/stream.hpp"

namespace troupe::detail::gpu {

/// Throws the error described above for a CUDA error code `code` (!= 0).
[[noreturn]] void fail(const char* op, int device, const char* call, int code);
/// fail() unless `code` is 0 (cudaSuccess).
inline void check(const char* op, int device, const char* call, int code) {
  if (code != 0) fail(op, device, call, code);
}

/// Makes `device` current on the calling thread.
void set_device(const char* op, int device);
/// A stream on `device` that is ordered with the legacy default stream (work
/// a user issued there before a call runs before it).
stream_t create_stream(const char* op, int device);
void destroy_stream(int device, stream_t s) noexcept;
/// Waits until the device's legacy default stream (stream nullptr) ran everything.
void synchronize(const char* op, int device);
/// Waits until everything issued on `s` ran, ignoring errors (for shutdown).
void synchronize_quietly(int device, stream_t s) noexcept;
/// An event without timing, for ordering and completion queries.
event_t create_event(const char* op, int device);
void destroy_event(int device, event_t e) noexcept;
void record(const char* op, int device, event_t e, stream_t s);
/// Work issued on `s` after this waits for `e` (which must have been recorded).
void wait_event(const char* op, int device, stream_t s, event_t e);
/// True once everything before `e` ran; throws when it failed.
bool event_done(const char* op, int device, event_t e);
/// Copies between any memory (cudaMemcpyDefault), in stream order.
void copy_async(const char* op, int device, void* dst, const void* src, std::size_t bytes,
                stream_t s);
/// Calls `fn(arg)` on a CUDA thread once `s` reaches this point. `fn` must not call CUDA.
void on_host(const char* op, int device, stream_t s, void (*fn)(void*), void* arg);
/// Throws when the last kernel launch on this thread failed (cudaGetLastError).
void check_launch(const char* op, int device, const char* kernel);
/// Whether kernels on `a` can read and write memory of `b` (true when a == b).
bool can_access_peer(int a, int b);
/// Enables access from `a` to `b` (idempotent).
void enable_peer_access(const char* op, int a, int b);
/// The device that owns `p` (-1 for host memory).
int device_of(const void* p);

}  // namespace troupe::detail::gpu
