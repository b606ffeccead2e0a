#pragma once
// What runs GPU work for a rank: a queue of jobs on one device, run in order
// on the rank's stream there (the device actor, actors/device_actor.hpp; tests
// use a queue on host memory). Free of CUDA and CAF.

#include <chrono>
#include <functional>
#include <string>

#include "cuda/stream.hpp"
#include "troupe/error.hpp"
#include "troupe/tensor.hpp"
#include "troupe/work.hpp"

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
  /// Completed with `outputs` as its result, or failed with the reason. A
  /// job without a work and without `after`, an internal step, only runs:
  /// it is done once issued (what fails on the stream after that fails the
  /// next job that has a work).
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

}  // namespace troupe::detail::gpu
