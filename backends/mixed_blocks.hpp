#pragma once
// mixed_blocks — the gathers whose tensors each have a dtype of their own
// (allgather_coalesced and allgather_into_tensor_coalesced, as c10d's
// allgather_coalesced takes them), moved as bytes.
//
// Terms: a rank's "block" is its layout (how many tensors, then each one's
// dtype and element count, as 8-byte words) followed by the bytes of each
// of its tensors in order; the call gathers every rank's block as uint8
// (an allgatherv). Ranks whose blocks differ in size disagree on the
// gather's counts, and its agreement names them; ranks whose layouts differ
// in blocks of one size are told once the blocks arrived: every rank reads
// every rank's layout and refuses alike (errc::mismatch, naming the ranks
// and their layouts) before it writes any output.

#include <cstddef>
#include <cstdint>
#include <functional>

#include "troupe/tensor.hpp"

namespace troupe::detail {

/// Whether every tensor of `ts` has the first one's dtype.
bool one_dtype(const tensor_list& ts);

/// This rank's block for `ins` (uint8, on their device).
tensor mixed_block(const tensor_list& ins);

/// Where tensor `i` of rank `r` goes: a tensor of that input's dtype and size.
using block_output = std::function<tensor(int r, std::size_t i)>;

/// Checks the layouts of the `size` blocks of `gathered` against this
/// rank's (`count` tensors; throws disagreement_error naming `op`, the
/// ranks and their layouts when they differ), then copies tensor i of rank
/// r into out(r, i).
void unpack_mixed_blocks(const char* op, const tensor& gathered, int size, std::size_t count,
                         const block_output& out);

}  // namespace troupe::detail
