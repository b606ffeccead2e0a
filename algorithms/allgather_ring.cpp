// allgather_ring — ring allgather of variable-size blocks (allgatherv).
//
// Terms: block b is rank b's input, counts[b] elements, placed at offset
// sum(counts[<b]) of the output. Rank r sends to right = r+1 and receives
// from left = r-1. Blocks travel in segments of about 1 MiB (one for small
// blocks); message (s, j) is segment j of step s.
// Step 0: copy the own input into its block and send it right, segment by
//   segment (the caller's memory where the transport copies it before send
//   returns, else a copy).
// Step s (1 .. size-1): receive block r-s from left, copy it into place, and
//   forward the same payload right unless it is the block right started with.
//   Between processes the receiving thread copies each segment into place as
//   it arrives (arrival handlers); this thread then forwards from the output.

#include <algorithm>

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class allgather_ring final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    const int r = ctx.rank();
    const ring_order order{ctx.topology(), n};  // host by host
    const int left = order.shifted(r, -1), right = order.shifted(r, 1);
    const auto dt = call.output.scalar_type();
    const auto offsets = offsets_of(call.counts);
    auto block = [&](int b) { return call.output.flat_slice(offsets[b], call.counts[b]); };
    auto segs_of = [&](int b) { return segments_of(call.counts[b], dt); };
    auto segment = [&](const tensor& t, int b, int j) {
      const auto [off, len] = chunk_range(call.counts[b], segs_of(b), j);
      return t.flat_slice(off, len);
    };
    if (step_ == 0) {
      for (int b = 0; b < n; ++b) segs_ = std::max(segs_, segs_of(b));
      // Handlers write only into the other ranks' blocks of the output.
      if (call.input.is_same(block(r)) || !overlaps(call.input, call.output))
        for (int s = 1; s < n; ++s) {
          const int b = order.shifted(r, -s);
          for (int j = 0; j < segs_of(b); ++j)
            receive_into(ctx, call, left, id(s, j), segment(block(b), b, j));
        }
      if (!call.input.is_same(block(r))) block(r).copy_from(call.input);
      if (n > 1)
        for (int j = 0; j < segs_of(r); ++j)
          ctx.send(right, id(1, j), to_send(ctx, right, segment(call.input, r, j)));
      step_ = 1;
    }
    for (; step_ < n; ++step_, seg_ = 0) {
      const int b = order.shifted(r, -step_);
      for (; seg_ < segs_of(b); ++seg_) {
        auto in = ctx.take(left, id(step_, seg_));
        if (!in) return false;
        auto out = segment(block(b), b, seg_);
        if (in->defined()) place(call, *in, out, left, id(step_, seg_));
        // The message goes on as it came, unless it came straight into the
        // output (a posted receive), which the caller writes after this call.
        const bool own_message = in->defined() && in->data() != out.data();
        if (step_ + 1 < n)
          ctx.send(right, id(step_ + 1, seg_), own_message ? *in : to_send(ctx, right, out));
      }
    }
    return true;
  }

 private:
  std::uint32_t id(int step, int j) const { return static_cast<std::uint32_t>(step * segs_ + j); }

  int step_ = 0;
  int seg_ = 0;   // the next segment of this step
  int segs_ = 1;  // the most segments of any block (message numbers)
};

}  // namespace

std::unique_ptr<algorithm> make_allgather_ring() {
  return std::make_unique<allgather_ring>();
}

}  // namespace troupe::detail
