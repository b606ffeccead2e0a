// direct_shm on the tiny lane (direct_shm.cpp says when): every source of
// the call fits it, so each rank posts its header and source there (an
// alltoall: its whole input, then its send and receive counts) and, once
// every rank posted, copies (reduce_scatter: reduces) what its output
// needs from the others' lanes. An alltoall whose ranks chose differently
// (uneven splits) moves to the slots.

#include "inline/shm/direct_shm_op.hpp"

#include "troupe/error.hpp"

namespace troupe::detail {

void direct_shm::post_on_tiny_lane(inline_context& ctx, bool& moved) {
  auto& c = call_;
  tiny_header call;
  call.nbytes = c.input.defined() ? c.input.nbytes() : 0;
  call.dtype = static_cast<std::uint32_t>(element_type().scalar_type());
  call.reduce = static_cast<std::uint32_t>(c.op.op());
  call.root = rooted(c.code) ? c.root : 0;
  const auto* in = c.input.defined() ? static_cast<const std::byte*>(c.input.data()) : nullptr;
  if (c.code != op_code::alltoallv) {
    call.counts_hash = hash_counts(c.counts);
    const auto mine = source_bytes(ctx, ctx.rank);
    post_tiny(ctx, call, in, static_cast<std::size_t>(std::max<std::int64_t>(mine, 0)), moved);
    return;
  }
  // alltoall: this rank's whole input, then its send and receive counts
  // (said to be even where they are, as tiny_direct's: splits_mark).
  std::array<std::int64_t, tiny_splits_bytes / sizeof(std::int64_t)> counts;
  const auto n = static_cast<std::size_t>(ctx.size);
  std::copy(c.counts.begin(), c.counts.end(), counts.begin());
  std::copy(c.recv_counts.begin(), c.recv_counts.end(), counts.begin() + n);
  const auto first = n ? counts[0] : 0;
  const bool even = std::all_of(counts.begin(), counts.begin() + 2 * n,
                                [&](std::int64_t k) { return k == first; }) &&
                    call.nbytes == n * static_cast<std::uint64_t>(first) *
                                       static_cast<std::uint64_t>(element_bytes());
  call.counts_hash = splits_mark(even, first);
  post_tiny(ctx, call, in, call.nbytes, moved, counts.data(), splits_bytes(ctx));
}

bool direct_shm::step_tiny(inline_context& ctx, bool& moved) {
  if (!tiny_posted(ctx)) {
    if (!to_slots_) return false;
    phase_ = phase::post;  // an alltoall whose lanes differ: through the slots
    return step(ctx, moved);
  }
  auto& c = call_;
  auto why = c.code == op_code::alltoallv ? wrong_splits(ctx) : std::string{};
  if (why.empty()) why = wrong_input(ctx, [&](int r) { return ctx.seg->tiny(r, op).nbytes; });
  if (!why.empty()) {
    finish_op(ctx, moved);
    throw disagreement_error(why);
  }
  own_part(ctx);
  consume_range(ctx, 0, longest_source(ctx),
                [&](int r) { return static_cast<const std::byte*>(ctx.seg->tiny_data(r, op)); });
  finish_op(ctx, moved);
  if (c.on_success) c.on_success();
  return true;
}

std::string direct_shm::wrong_splits(inline_context& ctx) const {
  return splits_agree(ctx, true) ? std::string{} : describe_disagreement(posted_calls(ctx, true));
}

}  // namespace troupe::detail
