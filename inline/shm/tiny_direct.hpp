#pragma once
// tiny_direct — direct_shm's collectives of even blocks on the segment's
// tiny lane, without a planned call: broadcast, gather and scatter of one
// tensor per rank, allgather_into_tensor, reduce_scatter_tensor and
// alltoall_single without split sizes, among the ranks of one host.
// inline/shm/tiny_direct.cpp says how.

#include <memory>

#include "base/call.hpp"
#include "inline/engine.hpp"
#include "troupe/reduce_op.hpp"

namespace troupe::detail {

/// What a tiny_direct operation moves (flat CPU tensors).
struct tiny_call {
  /// broadcast, gatherv, scatterv, allgatherv, reduce_scatterv or alltoallv
  /// (even splits).
  op_code code = op_code::broadcast;
  tensor input;   ///< this rank's (a broadcast's: its tensor; a scatter's: none)
  tensor output;  ///< this rank's (a broadcast's: its tensor; a gather's: none)
  int root = 0;   ///< broadcast, gather, scatter
  reduce_op::kind op = reduce_op::SUM;  ///< reduce_scatter (AVG: SUM, then divide)
  /// A scatter's root's inputs, one per rank (elsewhere none). A gather's
  /// root writes its outputs, the operation's `outputs` (the work's result,
  /// one per rank, set before it runs).
  tensor_list root_inputs;
  /// The work completes with `output` (the caller's tensor, flat already),
  /// moved out of the operation at its end: no second copy of it is held
  /// (each copy counts two owners up and down, a locked instruction each).
  bool output_is_result = false;
};

/// Whether a `code` call whose blocks (one rank's share: a broadcast's,
/// gather's and allgather's input, a scatter's and reduce_scatter's output;
/// for alltoall the larger of its input and output) are `block_bytes` goes
/// on the tiny lane in a group of `size` ranks: every rank's source fits it.
/// The same answer on every rank that passes the same sizes (an alltoall
/// rank with split sizes may choose the slots: tiny_direct then follows it
/// there).
bool fits_tiny_direct(op_code code, std::size_t block_bytes, int size);
/// The operation for `c`; the caller sets the op's fields and runs it on the
/// inline engine of a group whose ranks share this host.
std::unique_ptr<inline_op> make_tiny_direct(tiny_call&& c);

}  // namespace troupe::detail
