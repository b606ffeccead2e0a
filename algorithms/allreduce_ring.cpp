// allreduce_ring — ring reduce-scatter followed by ring allgather.
//
// Terms: the buffer of n elements is cut into `size` chunks; rank r sends to
// right = r+1 and receives from left = r-1. "mine[c]" is this rank's
// contribution to chunk c (its input, pre-scaled for PREMUL_SUM).
// Phase 1, reduce-scatter (steps 0 .. size-2): at step s rank r sends the
//   partial sum of chunk r-s and receives the partial of chunk r-s-1, which
//   it combines with mine into a new buffer. After size-1 steps rank r holds
//   the full reduction of chunk r+1.
// Phase 2, allgather (steps size-1 .. 2·size-3): each rank forwards the
//   finished chunk it holds or received last; every received chunk is copied
//   into the output.
// Every payload is a fresh buffer or one received unchanged, so sharing it
// with the receiver never races with later writes to the caller's memory.

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class allreduce_ring final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    const int r = ctx.rank();
    const int right = ring(r, 1, n);
    const int left = ring(r, -1, n);
    if (!started_) {
      started_ = true;
      mine_ = own_contribution(call, call.input);
      if (n == 1) {
        auto result = mine_.is_same(call.output) ? mine_ : fresh_copy(mine_);
        finish_reduction(call, result, n);
        if (!result.is_same(call.output)) call.output.copy_from(result);
        return true;
      }
      // Step 0: send our own contribution to chunk r.
      ctx.send(right, 0, fresh_copy(chunk(mine_, r, n)));
    }
    // Phase 1: reduce-scatter.
    while (step_ < n - 1) {
      auto in = ctx.take(left, step_);
      if (!in) return false;
      const int c = ring(r, -step_ - 1, n);
      auto [off, len] = chunk_range(call.input.numel(), n, c);
      check_payload(call, *in, len, left, step_);
      partial_ = combine(call.op, mine_.flat_slice(off, len), *in);
      ++step_;
      if (step_ < n - 1) ctx.send(right, step_, partial_);
    }
    // Chunk r+1 is complete: finish it, keep it, start the allgather with it.
    if (step_ == n - 1 && !sent_final_) {
      sent_final_ = true;
      const int c = ring(r, 1, n);
      finish_reduction(call, partial_, n);
      write(call, c, partial_, n);
      ctx.send(right, step_, partial_);
    }
    // Phase 2: allgather.
    while (step_ < 2 * n - 2) {
      auto in = ctx.take(left, step_);
      if (!in) return false;
      const int c = ring(r, -(step_ - (n - 1)), n);
      check_payload(call, *in, chunk_range(call.input.numel(), n, c).second, left, step_);
      write(call, c, *in, n);
      ++step_;
      if (step_ < 2 * n - 2) ctx.send(right, step_, *in);
    }
    return true;
  }

 private:
  static tensor chunk(const tensor& t, int c, int n) {
    auto [off, len] = chunk_range(t.numel(), n, c);
    return t.flat_slice(off, len);
  }
  static void write(collective_call& call, int c, const tensor& data, int n) {
    chunk(call.output, c, n).copy_from(data);
  }

  bool started_ = false;
  bool sent_final_ = false;
  int step_ = 0;
  tensor mine_;
  tensor partial_;
};

}  // namespace

std::unique_ptr<algorithm> make_allreduce_ring() {
  return std::make_unique<allreduce_ring>();
}

}  // namespace troupe::detail
