// allreduce_shm's chunked strategy for two ranks (allreduce_shm.cpp says
// when it runs): each rank reduces the whole of every chunk (no result
// slots, two cursors):
//   stage:  once the other rank reduced chunk g - slots, copy my whole chunk
//           into my staging slot; staged = g.
//   reduce: once both staged g, reduce the other's slot into my buffer in
//           place (a + b == b + a bit for bit, so both get the same bits);
//           reduced = g.
// Each rank copies N and reduces N, reading its own chunk from its cache
// right after staging it, which makes it faster for two ranks than the
// three-cursor strategy. A reduce's root stages nothing: nobody else
// reduces its chunk.

#include "inline/shm/allreduce_shm_op.hpp"

#include <utility>
#include "inline/shm/segment.hpp"
#include "kernels/reduce_kernels.hpp"

namespace troupe::detail {

/// Two ranks: both stage every chunk whole and reduce the other's copy
/// into their buffer (the reduce cursor first: it frees slots and uses the
/// chunk while it is in the cache; the stage cursor runs up to `slots`
/// chunks ahead of the other rank's reduce).
bool allreduce_shm::run_chunks_pair(inline_context& ctx, bool& moved) {
  auto& seg = *ctx.seg;
  const int other = 1 - ctx.rank;
  const auto es = static_cast<std::int64_t>(element_size(data_.scalar_type()));
  const auto slots = static_cast<std::int64_t>(seg.shape().chunk_slots);
  auto number = [&](std::int64_t i) { return first_ + static_cast<std::uint64_t>(i); };
  auto chunk = [&](std::int64_t i) {
    const auto begin = i * chunk_elems_;
    return std::pair{static_cast<std::byte*>(data_.data()) + begin * es,
                     std::min(chunk_elems_, data_.numel() - begin)};
  };
  const auto& peer = seg.progress(other);
  const char* waiting_for = "";
  for (bool progress = true; progress && reduced_ < chunks_;) {
    progress = false;
    // reduce: the other's copy of chunk i into mine (I staged mine first).
    if (reduced_ < staged_) {
      if (peer.staged.load(std::memory_order_acquire) >= number(reduced_)) {
        auto [mine, count] = chunk(reduced_);
        const void* srcs[2] = {mine, seg.stage(other, number(reduced_))};
        if (gets_result(ctx))
          reduce_many(data_.scalar_type(), kind_, mine, srcs, 2, static_cast<std::size_t>(count),
                      divisor_);
        publish(ctx, &rank_progress::reduced, number(reduced_++), moved);
        progress = true;
        continue;
      }
      waiting_for = "stage its chunk";
    }
    // stage: my chunk, once the other reduced the chunk this slot held.
    if (staged_ < chunks_) {
      if (staged_ < slots ||
          peer.reduced.load(std::memory_order_acquire) >= number(staged_ - slots)) {
        auto [mine, count] = chunk(staged_);
        // A reduce's root stages nothing: nobody else reduces its chunk.
        if (root_ < 0 || ctx.rank != root_)
          copy(seg.stage(ctx.rank, number(staged_)), mine, count * es);
        publish(ctx, &rank_progress::staged, number(staged_++), moved);
        progress = true;
        continue;
      }
      if (reduced_ == staged_) waiting_for = "reduce an earlier chunk";
    }
  }
  return end_chunks(ctx, moved, reduced_ == chunks_, other, waiting_for);
}

}  // namespace troupe::detail
