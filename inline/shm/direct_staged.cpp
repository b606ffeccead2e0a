// direct_shm between processes through the segment's staging slots
// (direct_shm.cpp says when: some rank's source cannot be mapped). Chunk by
// chunk (a ring of `chunk_slots` slots per rank): each rank stages its
// source's chunk i once every rank consumed chunk i - slots (the slot's
// last reader), staged = i; and consumes every rank's chunk i once staged,
// copying (reducing) what its output needs; consumed = i. The operation
// ends when it consumed every chunk and every rank consumed its last.

#include "inline/shm/direct_shm_op.hpp"

namespace troupe::detail {

void direct_shm::start_staged(inline_context& ctx) {
  const auto bytes = static_cast<std::int64_t>(ctx.seg->shape().chunk_bytes);
  chunks_ = (longest_source(ctx) + bytes - 1) / bytes;
  // A source nobody else reads (a gather's root's) is not staged.
  mine_ = read_by_others(ctx, ctx.rank) ? (source_bytes(ctx, ctx.rank) + bytes - 1) / bytes : 0;
  first_ = ctx.chunks + 1;
  ctx.chunks += static_cast<std::uint64_t>(chunks_);
  own_part(ctx);
}

bool direct_shm::run_staged(inline_context& ctx, bool& moved) {
  auto& seg = *ctx.seg;
  const auto slots = static_cast<std::int64_t>(seg.shape().chunk_slots);
  const auto bytes = static_cast<std::int64_t>(seg.shape().chunk_bytes);
  int waiting_rank = -1;
  const char* waiting_for = "";
  for (bool progress = true; progress;) {
    progress = false;
    if (consumed_ < chunks_) {
      const int r = consume(ctx, consumed_, bytes);
      if (r < 0) {
        publish(ctx, &rank_progress::consumed, number(consumed_++), moved);
        progress = true;
        continue;
      }
      waiting_rank = r;
      waiting_for = "stage its data";
    }
    if (staged_ < mine_) {
      const int r =
          staged_ >= slots ? short_of(ctx, &rank_progress::consumed, number(staged_ - slots)) : -1;
      if (r < 0) {
        const auto from = staged_ * bytes;
        const auto n = std::min(bytes, source_bytes(ctx, ctx.rank) - from);
        copy(seg.stage(ctx.rank, number(staged_)),
             static_cast<const std::byte*>(call_.input.data()) + from, n);
        publish(ctx, &rank_progress::staged, number(staged_++), moved);
        progress = true;
        continue;
      }
      if (waiting_rank < 0) {
        waiting_rank = r;
        waiting_for = "copy out an earlier chunk";
      }
    }
  }
  if (consumed_ < chunks_ || staged_ < mine_) return waiting(waiting_rank, waiting_for);
  // The next operation may reuse the slots once nobody reads them.
  if (chunks_ > 0 && !all_reached(ctx, &rank_progress::consumed, number(chunks_ - 1),
                                  "copy out this operation's last chunk"))
    return false;
  if (!finished_) {
    finished_ = true;
    finish_op(ctx, moved);
  }
  if (call_.on_success) call_.on_success();
  return true;
}

int direct_shm::consume(inline_context& ctx, std::int64_t i, std::int64_t bytes) {
  const auto lo = i * bytes, hi = lo + bytes;
  for (int r = 0; r < ctx.size; ++r) {
    if (r == ctx.rank) continue;
    const auto nd = needed(ctx, ctx.rank, r);
    if (std::max(nd.from, lo) < std::min(nd.to, hi) &&
        ctx.seg->progress(r).staged.load(std::memory_order_acquire) < number(i))
      return r;
  }
  consume_range(ctx, lo, hi, [&](int r) { return ctx.seg->stage(r, number(i)); });
  return -1;
}

}  // namespace troupe::detail
