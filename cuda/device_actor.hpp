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
// This header is free of CAF and CUDA; cuda/device_actor.cpp holds both.

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "cuda/runtime.hpp"
#include "troupe/error.hpp"
#include "troupe/tensor.hpp"
#include "troupe/work.hpp"

namespace troupe::detail {
class rank_runtime;
}

namespace troupe::detail::gpu {

/// One unit of work for a device actor.
struct device_job {
  /// The troupe call ("allreduce"), for error messages.
  std::string name;
  /// Issues the job's work on the stream (kernels, copies, NCCL calls). Runs
  /// in the device actor with the device current. Throws troupe::error.
  std::function<void(stream_t)> enqueue;
  /// Runs in the device actor once the stream passed the job, before the work
  /// completes (host-side bookkeeping). May throw troupe::error.
  std::function<void()> after;
  /// Polled while the job is pending: a non-empty answer fails the job with it.
  std::function<std::string()> health;
  /// Called once if the job fails or times out, with the error's code and
  /// message (to abort a communicator that may hang).
  std::function<void(errc, const std::string&)> on_failure;
  /// How long the job may take from its submission (0: no limit).
  std::chrono::milliseconds timeout{0};
  /// When it was submitted (set by device_queue::submit; its deadline counts from here).
  std::chrono::steady_clock::time_point submitted{};
  /// Completed with `outputs` as its result, or failed with the reason (a
  /// job without a work, an internal step, only runs).
  work handle;
  tensor_list outputs;
};

/// The handle of one device actor.
class device_queue {
 public:
  virtual ~device_queue() = default;
  /// The CUDA device index.
  virtual int device() const noexcept = 0;
  /// Hands `job` to the actor (returns at once).
  virtual void submit(device_job job) = 0;
  /// Fails every pending job with `reason` (the device actor stays usable).
  virtual void abort(const std::string& reason) = 0;
};

/// The device actor of rank `rt` on CUDA device `device`, spawned on first use.
/// Throws errc::backend when the device cannot be used.
std::shared_ptr<device_queue> device_queue_of(rank_runtime& rt, int device);

}  // namespace troupe::detail::gpu
