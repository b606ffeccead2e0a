// allgather_ring — ring allgather of variable-size blocks (allgatherv).
//
// Terms: block b is rank b's input, counts[b] elements, placed at offset
// sum(counts[<b]) of the output. Rank r sends to right = r+1 and receives
// from left = r-1.
// Step 0: copy the own input into its block and send a copy of it right.
// Step s (1 .. size-1): receive block r-s from left, copy it into place, and
//   forward the same payload right unless it is the block right started with.

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class allgather_ring final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    const int r = ctx.rank();
    const auto offsets = offsets_of(call.counts);
    auto block = [&](int b) { return call.output.flat_slice(offsets[b], call.counts[b]); };
    if (step_ == 0) {
      if (!call.input.is_same(block(r))) block(r).copy_from(call.input);
      if (n > 1) ctx.send(ring(r, 1, n), 1, to_send(ctx, ring(r, 1, n), call.input));
      step_ = 1;
    }
    for (; step_ < n; ++step_) {
      const int left = ring(r, -1, n);
      auto in = ctx.take(left, step_);
      if (!in) return false;
      const int b = ring(r, -step_, n);
      check_payload(call, *in, call.counts[b], left, step_);
      block(b).copy_from(*in);
      if (step_ + 1 < n) ctx.send(ring(r, 1, n), step_ + 1, *in);
    }
    return true;
  }

 private:
  int step_ = 0;
};

}  // namespace

std::unique_ptr<algorithm> make_allgather_ring() {
  return std::make_unique<allgather_ring>();
}

}  // namespace troupe::detail
