#pragma once
// How the "actor" backend handles cuda tensors outside the device exchange:
// calls with ranks in other processes run on host copies (results copied
// back when they succeed), and several local tensors of one call are
// combined on their device. The exchange between ranks of one process is
// backends/device_exchange.hpp.

#include <vector>

#include "base/call.hpp"

namespace troupe::detail {

/// The same collective on host copies of `c`'s tensors; its on_success copies
/// the result back to `c`'s output (then runs c's own on_success).
collective_call staged_through_host(const collective_call& c);

/// Turns a send or receive of a cuda tensor into one of a host copy (`c` is
/// changed to it); the returned work completes once a received copy is back
/// on the device.
work p2p_staged_through_host(p2p_call& c);

/// dst = srcs combined element-wise with `op` on dst's device; complete when
/// it returns (errc::backend in builds without CUDA).
void combine_on_device(const char* name, reduce_op::kind op, const tensor& dst,
                       const std::vector<const void*>& srcs);

}  // namespace troupe::detail
