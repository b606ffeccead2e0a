// allreduce_ring — ring reduce-scatter followed by ring allgather, in
// segments so that reducing one segment overlaps sending the next.
//
// Terms: the buffer of n elements is cut into `size` chunks; rank r sends to
// right = r+1 and receives from left = r-1. "mine[c]" is this rank's
// contribution to chunk c (its input, pre-scaled for PREMUL_SUM). Every chunk
// is cut into the same number of segments (about 1 MiB each; one for small
// buffers); message (s, j) is segment j of ring step s.
// Phase 1, reduce-scatter (steps 0 .. size-2): at step s rank r sends the
//   partial sum of chunk r-s and receives the partial of chunk r-s-1, which
//   it combines with mine into a new buffer, segment by segment: as soon as
//   segment j of step s arrived and was combined it goes on as (s+1, j).
//   After size-1 steps rank r holds the full reduction of chunk r+1.
// Phase 2, allgather (steps size-1 .. 2·size-3): each rank forwards the
//   finished segments it holds or received last; every received segment is
//   copied into the output.
// Every payload is a fresh buffer, one received unchanged, or one received
// from another process and reduced in place (combine_received: nothing else
// holds it), so sharing it with the receiver never races with later writes
// to the caller's memory
// (step 0 sends slices of the input itself, and phase 2 forwards segments
// received straight into the output, only when the transport copies the
// bytes before send returns).

#include <algorithm>

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

constexpr int ring_window = 4;  // step-0 segments in flight

class allreduce_ring final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    // Chunks are numbered by place on the ring (host by host: ring_order).
    const ring_order order{ctx.topology(), n};
    const int r = order.position(ctx.rank());
    const int right = order.shifted(ctx.rank(), 1);
    const int left = order.shifted(ctx.rank(), -1);
    if (!started_) {
      started_ = true;
      mine_ = own_contribution(call, call.input);
      if (n == 1) {
        auto result = mine_.is_same(call.output) ? mine_ : fresh_copy(mine_);
        finish_reduction(call, result, n);
        if (!result.is_same(call.output)) call.output.copy_from(result);
        return true;
      }
      const auto largest = chunk_range(call.input.numel(), n, 0).second;  // chunk 0 is largest
      segs_ = segments_of(largest, call.input.scalar_type());
      // The allgather's segments go straight into the output where the
      // transport can (between processes the reader then copies nothing
      // more). Each is written when it arrives, after this rank combined
      // that chunk's input (the chunk's partial sums passed through it) and
      // read nothing of it since: its sends were copies.
      for (int s = n - 1; s < 2 * n - 2; ++s)
        for (int j = 0; j < segs_; ++j) {
          const auto [off, len] =
              segment_range(call.input.numel(), n, ring(r, -(s - (n - 1)), n), j);
          ctx.post_receive(left, id(s, j), call.output.flat_slice(off, len));
        }
    }
    // Phase 1: reduce-scatter, segment by segment.
    for (;;) {
      // Step 0: our own contribution to chunk r, a few segments ahead of the
      // ones received (so the send never runs far ahead of the reduction).
      const int received0 = step_ > 0 ? segs_ : seg_;
      while (sent0_ < segs_ && sent0_ < received0 + ring_window) {
        auto part = segment(mine_, r, sent0_, n);
        ctx.send(right, id(0, sent0_), to_send(ctx, right, part));
        ++sent0_;
      }
      if (step_ >= n - 1) break;
      auto in = ctx.take(left, id(step_, seg_));
      if (!in) return false;
      const int c = ring(r, -step_ - 1, n);
      const auto [off, len] = segment_range(call.input.numel(), n, c, seg_);
      check_payload(call, *in, len, left, id(step_, seg_));
      auto partial = combine_received(ctx, left, call.op, mine_.flat_slice(off, len), *in);
      if (step_ + 1 < n - 1) {
        ctx.send(right, id(step_ + 1, seg_), partial);
      } else {
        // Segment j of chunk r+1 is complete: finish it, keep it, and start
        // the allgather with it.
        finish_reduction(call, partial, n);
        call.output.flat_slice(off, len).copy_from(partial);
        ctx.send(right, id(n - 1, seg_), partial);
      }
      if (++seg_ == segs_) {
        seg_ = 0;
        ++step_;
      }
    }
    // Phase 2: allgather.
    while (step_ < 2 * n - 2) {
      auto in = ctx.take(left, id(step_, seg_));
      if (!in) return false;
      const int c = ring(r, -(step_ - (n - 1)), n);
      const auto [off, len] = segment_range(call.input.numel(), n, c, seg_);
      place(call, *in, call.output.flat_slice(off, len), left, id(step_, seg_));
      // (`in` may be the caller's output, posted above: a copy where the
      // transport keeps what it sends.)
      if (step_ + 1 < 2 * n - 2) ctx.send(right, id(step_ + 1, seg_), to_send(ctx, right, *in));
      if (++seg_ == segs_) {
        seg_ = 0;
        ++step_;
      }
    }
    return true;
  }

 private:
  std::uint32_t id(int step, int seg) const {
    return static_cast<std::uint32_t>(step * segs_ + seg);
  }
  /// [offset, count] of segment j of chunk c.
  std::pair<std::int64_t, std::int64_t> segment_range(std::int64_t numel, int n, int c,
                                                      int j) const {
    const auto [off, len] = chunk_range(numel, n, c);
    const auto [soff, slen] = chunk_range(len, segs_, j);
    return {off + soff, slen};
  }
  tensor segment(const tensor& t, int c, int j, int n) const {
    const auto [off, len] = segment_range(t.numel(), n, c, j);
    return t.flat_slice(off, len);
  }

  bool started_ = false;
  int segs_ = 1;
  int step_ = 0;
  int seg_ = 0;
  int sent0_ = 0;  // step-0 segments sent
  tensor mine_;
};

}  // namespace

std::unique_ptr<algorithm> make_allreduce_ring() {
  return std::make_unique<allreduce_ring>();
}

}  // namespace troupe::detail
