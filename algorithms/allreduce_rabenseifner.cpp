// allreduce_rabenseifner — recursive halving reduce-scatter, then recursive
// doubling allgather (Rabenseifner's algorithm): 2·log2(p) steps like
// recursive doubling's log2(p), but each rank sends about 2·N bytes in all,
// as the ring does, instead of N per step. For middle sizes at many ranks,
// where the ring's 2(n-1) steps cost latency and recursive doubling's whole
// buffers cost bandwidth.
//
// Terms: p is the largest power of two <= n and extra = n - p; the first
// 2·extra ranks pair up (2i, 2i+1) and 2i stands for both, as in
// allreduce_recursive_doubling; "virtual rank" v numbers the p ranks that
// take part. The buffer is cut into p blocks (chunk_range); block b ends
// with virtual rank b. A rank holds a range [lo, hi) of blocks: the partial
// sums of those elements in `acc_`.
// Step 0 (fold, when n is not a power of two): rank 2i+1 sends its
//   contribution to 2i, which combines them (its own first); 2i+1 waits for
//   the result.
// Halving steps s = 0 .. log2(p)-1 (message 1 + s): with mask = p >> (s+1),
//   v and v XOR mask split their common range in two; the lower virtual rank
//   keeps the lower half. Each sends its partial sums of the half it gives
//   up and combines the partner's of the half it keeps (the lower virtual
//   rank's first). After the last, v holds block v fully reduced, finished
//   (AVG divided), and writes it into the output.
// Doubling steps, in reverse (message 1 + log2(p) + s): v and v XOR mask
//   exchange the ranges they hold, now final, straight from the output;
//   each range doubles until the whole output is filled.
// Last step (unfold): rank 2i sends the result to 2i+1.
// The input is read only up to the first halving step (sent slices are
// copies where the transport does not copy before send returns) and the
// output written only after it, so in-place calls are safe.

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class allreduce_rabenseifner final : public algorithm {
  static constexpr std::uint32_t fold_step = 0;
  static constexpr std::uint32_t unfold_step = 63;

 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    const int r = ctx.rank();
    if (!started_) {
      started_ = true;
      numel_ = call.input.numel();
      acc_ = own_contribution(call, call.input);  // never written: combines make new buffers
      while (p_ * 2 <= n) p_ *= 2;
      while ((1 << levels_) < p_) ++levels_;
      extra_ = n - p_;
      hi_ = p_;
      if (r < 2 * extra_ && r % 2 == 1) {  // folds into r - 1
        ctx.send(r - 1, fold_step, to_send(ctx, r - 1, acc_));
        folded_ = true;
      } else {
        v_ = r < 2 * extra_ ? r / 2 : r - extra_;
        fold_pending_ = r < 2 * extra_;
      }
    }
    if (folded_) {  // the result comes back from r - 1
      auto in = ctx.take(r - 1, unfold_step);
      if (!in) return false;
      place(call, *in, call.output, r - 1, unfold_step);
      return true;
    }
    if (fold_pending_) {  // Step 0: fold r + 1 in
      auto in = ctx.take(r + 1, fold_step);
      if (!in) return false;
      check_payload(call, *in, numel_, r + 1, fold_step);
      acc_ = combine_received(ctx, r + 1, call.op, acc_, *in);
      fold_pending_ = false;
    }
    if (!halve(ctx) || !double_up(ctx)) return false;
    if (r < 2 * extra_) ctx.send(r + 1, unfold_step, to_send(ctx, r + 1, call.output));
    return true;
  }

 private:
  /// The first element of block b (numel_ for b == p_).
  std::int64_t start_of(int b) const { return b >= p_ ? numel_ : chunk_range(numel_, p_, b).first; }
  /// The elements of blocks [lo, hi) of `t`, which holds blocks from `base` on.
  tensor blocks(const tensor& t, int base, int lo, int hi) const {
    return t.flat_slice(start_of(lo) - start_of(base), start_of(hi) - start_of(lo));
  }
  int partner_of(int mask) const {
    const int pv = v_ ^ mask;
    return pv < extra_ ? 2 * pv : pv + extra_;
  }

  /// The halving steps: true once block v_ is reduced and in the output.
  bool halve(op_context& ctx) {
    auto& call = ctx.call();
    for (; step_ < levels_; ++step_) {
      const int mask = p_ >> (step_ + 1);
      const int partner = partner_of(mask);
      const int mid = lo_ + (hi_ - lo_) / 2;
      const bool lower = (v_ & mask) == 0;
      const int keep_lo = lower ? lo_ : mid, keep_hi = lower ? mid : hi_;
      const auto id = static_cast<std::uint32_t>(1 + step_);
      if (!sent_) {
        const auto give = lower ? blocks(acc_, lo_, mid, hi_) : blocks(acc_, lo_, lo_, mid);
        ctx.send(partner, id, to_send(ctx, partner, give));
        sent_ = true;
      }
      auto in = ctx.take(partner, id);
      if (!in) return false;
      const auto mine = blocks(acc_, lo_, keep_lo, keep_hi);
      check_payload(call, *in, mine.numel(), partner, id);
      acc_ =
          lower ? combine_received(ctx, partner, call.op, mine, *in) : combine(call.op, *in, mine);
      lo_ = keep_lo;
      hi_ = keep_hi;
      sent_ = false;
    }
    if (step_ == levels_) {
      // Block v_ is reduced (acc_ is the input itself only when n == 1).
      if (overlaps(acc_, call.input) && !acc_.is_same(call.output)) acc_ = fresh_copy(acc_);
      finish_reduction(call, acc_, ctx.size());
      auto out = blocks(call.output, 0, lo_, hi_);
      if (!acc_.is_same(out)) out.copy_from(acc_);
      acc_ = tensor{};
      ++step_;
    }
    return true;
  }

  /// The doubling steps: true once the whole output is filled.
  bool double_up(op_context& ctx) {
    auto& call = ctx.call();
    // step_ is levels_ + 1 at the first doubling step (s = levels_ - 1).
    for (int s = 2 * levels_ - step_; s >= 0; --s) {
      const int mask = p_ >> (s + 1);
      const int partner = partner_of(mask);
      const bool lower = (v_ & mask) == 0;
      const int other_lo = lower ? hi_ : lo_ - (hi_ - lo_);
      const int other_hi = lower ? hi_ + (hi_ - lo_) : lo_;
      const auto id = static_cast<std::uint32_t>(1 + levels_ + s);
      if (!sent_) {
        ctx.send(partner, id, to_send(ctx, partner, blocks(call.output, 0, lo_, hi_)));
        sent_ = true;
      }
      auto in = ctx.take(partner, id);
      if (!in) return false;
      place(call, *in, blocks(call.output, 0, other_lo, other_hi), partner, id);
      lo_ = lower ? lo_ : other_lo;
      hi_ = lower ? other_hi : hi_;
      sent_ = false;
      ++step_;
    }
    return true;
  }

  bool started_ = false;
  bool folded_ = false;
  bool fold_pending_ = false;
  bool sent_ = false;
  int step_ = 0;  // halving steps 0 .. levels_-1, then levels_, then one per doubling step
  int p_ = 1, levels_ = 0, extra_ = 0, v_ = 0;
  int lo_ = 0, hi_ = 1;  // the blocks this rank holds
  std::int64_t numel_ = 0;
  tensor acc_;  // partial sums of blocks [lo_, hi_) while halving
};

}  // namespace

std::unique_ptr<algorithm> make_allreduce_rabenseifner() {
  return std::make_unique<allreduce_rabenseifner>();
}

}  // namespace troupe::detail
