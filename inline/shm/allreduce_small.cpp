// allreduce_shm's small strategies (allreduce_shm.cpp says when they run):
// the buffer fits a small slot. `small`: each rank's data went with its
// descriptor, so once every rank posted each reduces the n slots straight
// into its buffer (one step). `small_staged` (between processes, some
// buffer private): the data is copied into the slot after the agreement,
// staged = a fresh chunk number, and reduced the same way once all staged.

#include "inline/shm/allreduce_shm_op.hpp"

#include <utility>
#include "base/small_vector.hpp"
#include "inline/shm/segment.hpp"
#include "kernels/reduce_kernels.hpp"

namespace troupe::detail {

void allreduce_shm::reduce_small(inline_context& ctx) {
  if (!gets_result(ctx)) return;
  small_vector<const void*, 8> srcs(static_cast<std::size_t>(ctx.size));
  for (int r = 0; r < ctx.size; ++r)
    srcs[static_cast<std::size_t>(r)] =
        r == ctx.rank ? data_.data() : static_cast<const void*>(ctx.seg->small_slot(r, op));
  // Two operands: every op is commutative bit for bit (a + b == b + a in
  // IEEE arithmetic; only which of two NaNs' payloads survives can differ,
  // and the result is NaN either way), so rank 1 may put its own data first and
  // accumulate in place, as rank 0 does, rather than through a scratch
  // buffer. With more operands the order is the rank order (sums do not
  // associate).
  if (ctx.size == 2 && ctx.rank == 1) std::swap(srcs[0], srcs[1]);
  reduce_many(data_.scalar_type(), kind_, data_.data(), srcs.data(), srcs.size(),
              static_cast<std::size_t>(data_.numel()), divisor_);
}

}  // namespace troupe::detail
