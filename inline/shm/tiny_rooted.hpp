#pragma once
// tiny_rooted — a broadcast, gather or scatter of one tensor per rank whose
// data fits the segment's tiny lane, among the ranks of one host.
// inline/shm/tiny_rooted.cpp says how.

#include <memory>

#include "base/call.hpp"
#include "inline/engine.hpp"

namespace troupe::detail {

/// Whether a `code` call (broadcast, gatherv or scatterv) of one CPU tensor
/// `t` per rank (the broadcast's, a gather's input, a scatter's output) in a
/// group of `size` ranks goes on the tiny lane: the same answer on every rank
/// that passes the same size.
bool fits_tiny_rooted(op_code code, const tensor& t, int size);
/// The operation for that call from group rank `root`, on this rank's flat
/// tensor `data`; `root_inputs`: a scatter's root's list of inputs (one per
/// rank; empty elsewhere). A gather's root writes its outputs, the operation's `outputs` (the
/// work's result: one per rank, set before it runs). The caller sets the
/// op's fields and runs it on the inline engine of a group whose ranks share
/// this host.
std::unique_ptr<inline_op> make_tiny_rooted(op_code code, tensor data, int root,
                                            const tensor_list& root_inputs);

}  // namespace troupe::detail
