// allreduce_shm's tiny strategy (allreduce_shm.cpp says when it runs): up to
// tiny_bytes, and every barrier. Each rank posts its header and data on its
// tiny lane (shm_op.hpp: one cache line a peer polls, stamped last); once
// every rank posted, each reduces the others' lanes into its buffer, in
// rank order.

#include "inline/shm/allreduce_shm_op.hpp"

#include <utility>
#include "base/small_vector.hpp"
#include "inline/shm/segment.hpp"
#include "kernels/reduce_kernels.hpp"

namespace troupe::detail {

/// Up to tiny_bytes (and every barrier): on the tiny lane (shm_op.hpp),
/// each rank reducing from the others' lanes.
bool allreduce_shm::step_tiny(inline_context& ctx, bool& moved) {
  auto& seg = *ctx.seg;
  const auto me = ctx.rank;
  const auto nbytes = static_cast<std::uint64_t>(data_.nbytes());
  if (phase_ == phase::post) {
    if (!tiny_lane_free(ctx)) return false;
    tiny_header call;
    call.nbytes = nbytes;
    call.dtype = static_cast<std::uint32_t>(data_.scalar_type());
    call.reduce = static_cast<std::uint32_t>(divisor_ > 0 ? reduce_op::AVG : kind_);
    call.root = std::max(root_, 0);
    post_tiny(ctx, call, data_.data(), nbytes, moved);
    phase_ = phase::tiny_wait;
  }
  if (!tiny_posted(ctx)) return false;
  if (gets_result(ctx) && nbytes > 0) {
    small_vector<const void*, 8> srcs(static_cast<std::size_t>(ctx.size));
    for (int r = 0; r < ctx.size; ++r)
      srcs[static_cast<std::size_t>(r)] =
          r == me ? data_.data() : static_cast<const void*>(seg.tiny_data(r, op));
    if (ctx.size == 2 && me == 1) std::swap(srcs[0], srcs[1]);  // as reduce_small
    reduce_many(data_.scalar_type(), kind_, data_.data(), srcs.data(), srcs.size(),
                static_cast<std::size_t>(data_.numel()), divisor_);
  }
  reduced_bytes_ = nbytes;
  finish_op(ctx, moved);
  return true;
}

}  // namespace troupe::detail
