// allreduce_shm's direct strategy (allreduce_shm.cpp says when it runs):
// ranks of one process, or of several processes whose buffers are all
// shared (tensor::empty_shared, or moved there in place; memory/peer_memory
// maps them). "Part q" is the q-th of n cache-line-aligned slices: rank q
// reduces part q of every rank's buffer into its own and copies it into
// every other buffer (a reduce: into the root's alone); done = k; the
// operation returns once every rank is done (the others write into this
// rank's buffer).

#include "inline/shm/allreduce_shm_op.hpp"

#include <algorithm>
#include "base/small_vector.hpp"
#include "kernels/reduce_kernels.hpp"

namespace troupe::detail {

/// Reduce part (me) of every rank's buffer straight into my buffer and
/// copy it into every other rank's buffer (one read of N and one write of
/// N per rank: the memory ceiling), in cache-sized pieces. A reduce writes
/// part (me) into the root's buffer alone.
void allreduce_shm::reduce_direct(inline_context& ctx) {
  const auto n = ctx.size;
  const auto me = ctx.rank;
  const auto es = static_cast<std::int64_t>(element_size(data_.scalar_type()));
  small_vector<std::byte*, 8> bufs(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) bufs[static_cast<std::size_t>(r)] = buffer_of(ctx, r);
  const auto [off, count] = part(data_.numel(), n, me);
  const std::int64_t piece = std::max<std::int64_t>(1, (32 << 10) / es);
  small_vector<const void*, 8> srcs(static_cast<std::size_t>(n));
  for (std::int64_t done = 0; done < count; done += piece) {
    const auto m = std::min(piece, count - done);
    const auto at = (off + done) * es;
    // The destination's first, then the others in rank order: each element
    // is reduced by one rank only, so any fixed order gives every rank the
    // same result, and this one accumulates in place.
    const int dst = root_ < 0 ? me : root_;
    std::size_t k = 0;
    srcs[k++] = bufs[static_cast<std::size_t>(dst)] + at;
    for (int r = 0; r < n; ++r)
      if (r != dst) srcs[k++] = bufs[static_cast<std::size_t>(r)] + at;
    std::byte* out = bufs[static_cast<std::size_t>(dst)] + at;
    reduce_many(data_.scalar_type(), kind_, out, srcs.data(), srcs.size(),
                static_cast<std::size_t>(m), divisor_);
    if (root_ >= 0) continue;
    for (int r = 0; r < n; ++r)
      if (r != me) copy(bufs[static_cast<std::size_t>(r)] + at, out, m * es);
  }
}

}  // namespace troupe::detail
