#pragma once
// The inline engine's operations (one file each, like algorithms/).

#include <memory>

#include "inline/engine.hpp"
#include "troupe/reduce_op.hpp"

namespace troupe::detail {

/// allreduce of the flat buffer `data` in place, combining by `kind`;
/// `divisor` > 0 divides the result (AVG). The caller sets the op's fields.
/// With an empty buffer and `code` barrier it is the group's barrier (every
/// rank posts, everyone waits until all posted). With `root` >= 0 it is
/// the reduce to that group rank: the other ranks' buffers are left as they were.
/// `data_is_output`: the work completes with `data` as its sole output (the
/// caller's tensor was flat already; no second copy of it is held).
std::unique_ptr<inline_op> make_allreduce_shm(tensor data, reduce_op::kind kind, double divisor,
                                              std::uint8_t code, int root = -1,
                                              bool data_is_output = false);

}  // namespace troupe::detail
