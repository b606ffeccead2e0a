#pragma once
// The "nccl" backend: c10d's ProcessGroupNCCL for cuda tensors, on NCCL
// communicators driven by the rank's device actor (actors/device_actor.hpp).
// See backends/nccl_group.hpp for the design, backends/nccl_backend.cpp for the mapping
// of every call.
//
// This header is free of CUDA, NCCL and CAF; the backend exists only in
// builds with CUDA and NCCL (TROUPE_HAVE_NCCL). Tests that run its plans on
// another plan_runner (backends/nccl_runner.hpp) include that header too.

#include <memory>

#include "troupe/backend.hpp"

namespace troupe::detail {

/// A backend for one group on cuda tensors. `ctx.runtime` must be the rank's
/// rank_runtime; `ctx.store` is the group's private store (NCCL unique ids).
std::shared_ptr<backend> make_nccl_backend(const backend_context& ctx);

namespace nccl {
class plan_runner;
}

/// A backend whose plans `runner` runs (tests: an emulator of NCCL on host
/// memory); `ctx` needs rank, size, group_name and timeout only.
std::shared_ptr<backend> make_nccl_backend(const backend_context& ctx,
                                           std::shared_ptr<nccl::plan_runner> runner);

}  // namespace troupe::detail
