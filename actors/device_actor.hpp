#pragma once
// The device actor: one per GPU per rank. It owns the rank's CUDA stream on
// that device and is the only code that issues work on it. Backends hand it
// jobs; it runs each job's `enqueue` on the stream in the order received,
// learns of completion through a host callback (and, as a fallback that also
// catches failed kernels, by polling the job's event), and then completes the
// job's work from the actor, so that no thread blocks on the GPU.
//
// A job fails, never aborts the process, when enqueueing throws (a CUDA or
// NCCL call failed: the message names the call, the device and the error), when
// its event reports an error, when its health check reports one (NCCL's
// asynchronous errors), or when its deadline passes.
//
// This header is free of CAF and CUDA; actors/device_actor.cpp holds the
// actor and reaches CUDA through cuda/runtime.hpp.

#include <memory>

#include "cuda/device_queue.hpp"
#include "cuda/runtime.hpp"

namespace troupe::detail {
class rank_runtime;
}

namespace troupe::detail::gpu {

/// The device actor of rank `rt` on CUDA device `device`, spawned on first use.
/// Throws errc::backend when the device cannot be used.
std::shared_ptr<device_queue> device_queue_of(rank_runtime& rt, int device);

}  // namespace troupe::detail::gpu
