#pragma once
// tiny_direct — direct_shm's collectives of even blocks on the segment's
// tiny lane, without a planned call: broadcast, gather and scatter of one
// tensor per rank, allgather_into_tensor, reduce_scatter_tensor and
// alltoall_single without split sizes, among the ranks of one host.
// inline/shm/tiny_direct.cpp says how.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "base/call.hpp"
#include "inline/shm/shm_op.hpp"
#include "troupe/reduce_op.hpp"

namespace troupe::detail {

/// What a tiny_direct operation moves (flat CPU tensors), borrowed from the
/// caller: the operation reads them through these pointers while it runs in
/// the caller's thread, and holds tensors of its own only once it is queued
/// (tiny_direct::keep; each copy of a tensor counts its two owners up and
/// down, a locked instruction each).
struct tiny_call {
  /// broadcast, gatherv, scatterv, allgatherv, reduce_scatterv or alltoallv
  /// (even splits).
  op_code code = op_code::broadcast;
  const tensor* input = nullptr;   ///< this rank's (a broadcast's: its tensor; a scatter's: none)
  const tensor* output = nullptr;  ///< this rank's (a broadcast's: its tensor; a gather's: none)
  int root = 0;                    ///< broadcast, gather, scatter
  reduce_op::kind op = reduce_op::SUM;  ///< reduce_scatter (AVG: SUM, then divide)
  /// A scatter's root's inputs, one per rank (elsewhere none), given to the
  /// operation: it moves them once queued. A gather's root writes its
  /// outputs, the operation's `outputs` (the work's result, one per rank,
  /// set before it runs).
  tensor_list* root_inputs = nullptr;
  /// The work completes with `output` (the caller's tensor, flat already).
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

/// The operation of a tiny_call. The caller makes it on its stack, sets the
/// op's fields and issues it with inline_engine::submit_borrowed on the
/// inline engine of a group whose ranks share this host: a call whose peers
/// posted first ends there, without an operation on the heap; one that waits
/// goes into the engine's queue as keep() made it.
class tiny_direct final : public shm_op {
 public:
  explicit tiny_direct(const tiny_call& c);

  bool step(inline_context& ctx, bool& moved) override;
  std::unique_ptr<inline_op> keep() override;
  std::pair<int, std::string> blocker() const override;
  int blocked_rank() const override;
  std::string disagreement() const override;

 private:
  tiny_direct(tiny_direct&&) = default;

  bool advance(inline_context& ctx, bool& moved);
  op_code code() const { return call_.code; }
  /// One rank's share in bytes (kept: asked by every step).
  std::int64_t block() const { return block_; }
  std::int64_t expected_input(inline_context& ctx, int r, int size) const;
  /// Where rank r's posted data lies.
  const std::byte* lane(inline_context& ctx, int r) const { return ctx.seg->tiny_data(r, op); }
  void post(inline_context& ctx, bool& moved);
  bool follow_to_slots(inline_context& ctx, bool& moved);
  std::string wrong_input(inline_context& ctx) const;
  void take(inline_context& ctx);
  void exchange(inline_context& ctx);
  void exchange_even(inline_context& ctx);
  void place(std::byte* to, const std::byte* from);
  void reduce_mine(inline_context& ctx);
  /// A scatter's root's input for rank r.
  const std::byte* root_input(int r) const {
    return static_cast<const std::byte*>((*call_.root_inputs)[static_cast<std::size_t>(r)].data());
  }

  tiny_call call_;
  // What the call's tensors tell, read once: every step asks.
  const std::byte* input_ = nullptr;  ///< its data (none: null)
  std::byte* output_ = nullptr;       ///< its data (none: null)
  std::int64_t input_bytes_ = -1;     ///< -1: no input
  std::int64_t input_numel_ = 0;
  std::int64_t output_numel_ = 0;
  std::int64_t block_;
  std::int64_t block_numel_;  ///< block_ in elements
  dtype dtype_;
  bool posted_ = false;
  /// An alltoall's posted splits are even (shm_op::splits_mark) of
  /// even_bytes_ per rank.
  bool even_ = false;
  std::int64_t even_bytes_ = 0;
  /// The tensors call_ points to once kept (keep).
  tensor kept_input_, kept_output_;
  tensor_list kept_root_inputs_;
  /// An alltoall that follows a rank into the slots (follow_to_slots).
  std::unique_ptr<inline_op> slots_;
};

}  // namespace troupe::detail
