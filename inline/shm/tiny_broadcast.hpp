#pragma once
// tiny_broadcast — a broadcast of at most tiny_bytes among the ranks of one
// host, on the segment's tiny lanes. inline/shm/tiny_broadcast.cpp says how.

#include <memory>

#include "inline/engine.hpp"

namespace troupe::detail {

/// Whether a broadcast of `t` (a CPU tensor) goes on the tiny lane: the same
/// answer on every rank that passes the same size.
bool fits_tiny_broadcast(const tensor& t);
/// The broadcast of the flat buffer `data` (fits_tiny_broadcast) from group
/// rank `root`; the caller sets the op's fields and runs it on the inline
/// engine of a group whose ranks share this host.
std::unique_ptr<inline_op> make_tiny_broadcast(tensor data, int root);

}  // namespace troupe::detail
