#pragma once
// The direct plan: a collective among ranks of one process whose buffers one
// device reaches (ranks sharing a GPU). No messages and no staging: once
// every rank posted its call, each rank computes a share of the result
// straight from its peers' buffers and writes it straight into theirs.
//
// Shares are disjoint: rank r owns chunk r of a reduction (it reads chunk r of
// every input and writes chunk r of every output) or its own block of a
// gather (it copies its input into every output). So ranks never write what
// another rank reads, and an in-place allreduce is safe. An in-place alltoall
// is the exception: rank r writes block r of rank j's buffer while rank j
// reads it, so its input is copied first (needs_snapshot).
//
// The plan is a list of element-wise steps (gpu::reduce_args: sources,
// destinations, op, scales, divisor); backends/device_exchange.cpp runs them as
// kernels, run_on_cpu() runs them with the CPU kernels (for tests).

#include <string>
#include <vector>

#include "base/call.hpp"
#include "cuda/kernels.hpp"

namespace troupe::detail {

using plan_step = gpu::reduce_args;

/// Throws errc::mismatch when the ranks' calls (calls[r] is rank r's) differ
/// in kind, and errc::invalid_argument naming the rank and values when they
/// differ in dtype, size, root, op or counts.
void check_calls_agree(const std::vector<const collective_call*>& calls);

/// Whether the plan must read a copy of this call's input, taken before the
/// rank posts it: its input is its output (in place) and other ranks write
/// there what this rank has still to read (alltoall).
bool needs_snapshot(const collective_call& c);

/// The steps of rank `rank` (the calls must agree).
std::vector<plan_step> direct_plan(const std::vector<const collective_call*>& calls, int rank);

/// Runs steps with the CPU kernels (host memory only).
void run_on_cpu(const std::vector<plan_step>& steps);

}  // namespace troupe::detail
