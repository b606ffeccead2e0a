#pragma once
// Launching one job's plan (backends/nccl_plan.hpp) on the rank's stream, in the
// device actor: kernels before, the PREMUL_SUM ops, one NCCL group of
// collectives and sends/receives, kernels after. A non-blocking communicator
// launches in the background (ncclGroupEnd returns ncclInProgress): launch()
// polls until the work is on the stream, so that the stream runs the jobs in
// order, giving up past `timeout` or once `stop` is set.

#include <atomic>

#include "backends/nccl_plan.hpp"
#include "cuda/stream.hpp"
#include "troupe/options.hpp"

namespace troupe::detail::nccl {

/// Issues `p` on `stream` with `comm`; throws troupe::error naming `op`,
/// the device and NCCL's error.
void launch(const char* op, int device, ncclComm_t comm, gpu::stream_t stream,
            const std::atomic<bool>& stop, timeout_t timeout, const plan& p);

}  // namespace troupe::detail::nccl
