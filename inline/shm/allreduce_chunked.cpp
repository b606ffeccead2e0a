// allreduce_shm's chunked strategy, 3 or more ranks (allreduce_shm.cpp says
// when it runs): large buffers between processes, some of them private.
// Per chunk g (a ring of `chunk_slots` staging and result slots; three
// cursors, each running ahead as far as the peers allow; "part q" of a chunk
// is the q-th of n cache-line-aligned slices, which rank q reduces):
//   stage:  once every rank reduced chunk g - slots (the last reader of the
//           slot), copy the parts of my chunk that others reduce into my
//           staging slot; staged = g.
//   reduce: once every rank staged g and consumed g - slots, reduce part (me)
//           from my own buffer and the others' staging slots into the result
//           slot and my buffer; reduced = g.
//   gather: once every rank reduced g, copy the other parts of the result
//           slot into my buffer; consumed = g.
// Each rank copies about 2N bytes in all (stage (n-1)/n·N, own part N/n,
// gather (n-1)/n·N) and reads N for its reduction: one copy per hop. A
// reduce's non-roots skip copying results out.

#include "inline/shm/allreduce_shm_op.hpp"

#include <algorithm>
#include "base/small_vector.hpp"
#include "inline/shm/segment.hpp"
#include "kernels/reduce_kernels.hpp"

namespace troupe::detail {

void allreduce_shm::start_chunks(inline_context& ctx) {
  const auto chunk = ctx.seg->shape().chunk_bytes / element_size(data_.scalar_type());
  chunk_elems_ = static_cast<std::int64_t>(chunk);
  chunks_ = (data_.numel() + chunk_elems_ - 1) / chunk_elems_;
  first_ = ctx.chunks + 1;
  ctx.chunks += static_cast<std::uint64_t>(chunks_);
}

/// The three cursors run as far as the peers allow, each up to `slots`
/// chunks ahead of the next: gather first (it frees slots), then reduce,
/// then stage. A rank ahead of the others stages the next chunks instead of
/// waiting, so the ranks need not run in lockstep.
bool allreduce_shm::run_chunks(inline_context& ctx, bool& moved) {
  auto& seg = *ctx.seg;
  const auto n = ctx.size;
  const auto me = ctx.rank;
  const auto es = static_cast<std::int64_t>(element_size(data_.scalar_type()));
  auto* base = static_cast<std::byte*>(data_.data());
  const auto slots = static_cast<std::int64_t>(seg.shape().chunk_slots);
  auto number = [&](std::int64_t i) { return first_ + static_cast<std::uint64_t>(i); };
  auto before = [&](std::int64_t i) {  // the chunk number `slots` earlier (0: none)
    return i >= slots ? number(i - slots) : 0;
  };
  struct chunk_view {
    std::byte* mine;
    std::int64_t bytes, my_off, my_bytes;
  };
  auto view = [&](std::int64_t i) {
    const auto begin = i * chunk_elems_;
    const auto m = std::min(chunk_elems_, data_.numel() - begin);
    const auto [off, count] = part(m, n, me);
    return chunk_view{base + begin * es, m * es, off * es, count * es};
  };
  int waiting_rank = -1;
  const char* waiting_for = "";
  for (bool progress = true; progress && gathered_ < chunks_;) {
    progress = false;
    // gather: every part of the result slot but mine into my buffer.
    if (gathered_ < reduced_) {
      const int r = short_of(ctx, &rank_progress::reduced, number(gathered_));
      if (r < 0) {
        const auto c = view(gathered_);
        const std::byte* result = seg.result(number(gathered_));
        if (gets_result(ctx)) {
          copy(c.mine, result, c.my_off);
          copy(c.mine + c.my_off + c.my_bytes, result + c.my_off + c.my_bytes,
               c.bytes - c.my_off - c.my_bytes);
        }
        publish(ctx, &rank_progress::consumed, number(gathered_++), moved);
        progress = true;
        continue;
      }
      waiting_rank = r;
      waiting_for = "reduce its part of a chunk";
    }
    // reduce: my part, from my buffer and the others' staging slots, into
    // the result slot (free once everyone copied chunk i - slots out).
    if (reduced_ < staged_) {
      int r = short_of(ctx, &rank_progress::staged, number(reduced_));
      const char* what = "stage its chunk";
      if (r < 0) {
        r = short_of(ctx, &rank_progress::consumed, before(reduced_));
        what = "copy out an earlier chunk";
      }
      if (r < 0) {
        const auto c = view(reduced_);
        const auto g = number(reduced_);
        small_vector<const void*, 8> srcs(static_cast<std::size_t>(n));
        for (int q = 0; q < n; ++q)
          srcs[static_cast<std::size_t>(q)] = (q == me ? c.mine : seg.stage(q, g)) + c.my_off;
        std::byte* out = seg.result(g) + c.my_off;
        const auto count = c.my_bytes / es;
        reduce_many(data_.scalar_type(), kind_, out, srcs.data(), srcs.size(),
                    static_cast<std::size_t>(count), divisor_);
        if (gets_result(ctx)) copy(c.mine + c.my_off, out, c.my_bytes);
        publish(ctx, &rank_progress::reduced, number(reduced_++), moved);
        progress = true;
        continue;
      }
      if (waiting_rank < 0) {
        waiting_rank = r;
        waiting_for = what;
      }
    }
    // stage: the parts the others reduce, once everyone reduced chunk
    // i - slots (which read this slot).
    if (staged_ < chunks_) {
      const int r = short_of(ctx, &rank_progress::reduced, before(staged_));
      if (r < 0) {
        const auto c = view(staged_);
        std::byte* slot = seg.stage(me, number(staged_));
        copy(slot, c.mine, c.my_off);
        copy(slot + c.my_off + c.my_bytes, c.mine + c.my_off + c.my_bytes,
             c.bytes - c.my_off - c.my_bytes);
        publish(ctx, &rank_progress::staged, number(staged_++), moved);
        progress = true;
        continue;
      }
      if (waiting_rank < 0) {
        waiting_rank = r;
        waiting_for = "reduce an earlier chunk";
      }
    }
  }
  return end_chunks(ctx, moved, gathered_ == chunks_, waiting_rank, waiting_for);
}

/// Finishes the operation once its chunks are `done`; else remembers whom
/// it waits for, and for what.
bool allreduce_shm::end_chunks(inline_context& ctx, bool& moved, bool done, int rank,
                               const char* what) {
  if (!done) return waiting(rank, what);
  finish_op(ctx, moved);
  return true;
}

}  // namespace troupe::detail
