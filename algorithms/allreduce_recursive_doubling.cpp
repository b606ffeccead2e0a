// allreduce_recursive_doubling — log2(n) exchanges of the whole buffer: for
// buffers whose time is latency at many ranks, where the direct algorithm's
// n-1 messages per rank do not scale and the ring's 2(n-1) steps are slow.
//
// Terms: p is the largest power of two <= n and extra = n - p; the first
// 2·extra ranks pair up (2i, 2i+1) and 2i stands for both; the others keep
// their place. "Virtual rank" v numbers the p ranks that take part:
// rank 2i is v = i (i < extra), rank r >= 2·extra is v = r - extra.
// Step 0 (fold, when n is not a power of two): rank 2i+1 sends its
//   contribution to 2i, which combines them (its own first) and goes on;
//   2i+1 waits for the result.
// Steps 1 .. log2 p: virtual rank v exchanges its partial sum with virtual
//   rank v XOR 2^(k-1) and combines the two, the lower virtual rank's
//   first, so both partners hold the same bits.
// Last step (unfold): rank 2i sends the result (AVG divided) to 2i+1.

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

constexpr std::uint32_t unfold_step = 63;

class allreduce_recursive_doubling final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    const int r = ctx.rank();
    const auto numel = call.input.numel();
    if (!started_) {
      started_ = true;
      acc_ = own_contribution(call, call.input);  // never written: combines make new buffers
      while (p_ * 2 <= n) p_ *= 2;
      extra_ = n - p_;
      if (r < 2 * extra_ && r % 2 == 1) {  // folds into r - 1
        ctx.send(r - 1, 0, to_send(ctx, r - 1, acc_));
        step_ = -1;
      } else {
        v_ = r < 2 * extra_ ? r / 2 : r - extra_;
        step_ = r < 2 * extra_ ? 0 : 1;
      }
    }
    if (step_ < 0) {  // the result comes back from r - 1
      auto in = ctx.take(r - 1, unfold_step);
      if (!in) return false;
      place(call, *in, call.output, r - 1, unfold_step);
      return true;
    }
    if (step_ == 0) {  // Step 0: fold r + 1 in
      auto in = ctx.take(r + 1, 0);
      if (!in) return false;
      check_payload(call, *in, numel, r + 1, 0);
      acc_ = combine_received(ctx, r + 1, call.op, acc_, *in);
      step_ = 1;
    }
    for (; (1 << (step_ - 1)) < p_; ++step_) {
      const int mask = 1 << (step_ - 1);
      const int partner_v = v_ ^ mask;
      const int partner = partner_v < extra_ ? 2 * partner_v : partner_v + extra_;
      const auto id = static_cast<std::uint32_t>(step_);
      if (!sent_) {
        ctx.send(partner, id, to_send(ctx, partner, acc_));
        sent_ = true;
      }
      auto in = ctx.take(partner, id);
      if (!in) return false;
      check_payload(call, *in, numel, partner, id);
      acc_ = v_ < partner_v ? combine_received(ctx, partner, call.op, acc_, *in)
                            : combine(call.op, *in, acc_);
      sent_ = false;
    }
    // Last step: the result, divided for AVG, out and to the folded rank.
    if (acc_.is_same(call.input) && !acc_.is_same(call.output)) acc_ = fresh_copy(acc_);  // n == 1
    finish_reduction(call, acc_, n);
    if (r < 2 * extra_) ctx.send(r + 1, unfold_step, to_send(ctx, r + 1, acc_));
    if (!acc_.is_same(call.output)) call.output.copy_from(acc_);
    return true;
  }

 private:
  bool started_ = false;
  bool sent_ = false;
  int step_ = 0;  // -1: folded, waiting for the result
  int p_ = 1, extra_ = 0, v_ = 0;
  tensor acc_;
};

}  // namespace

std::unique_ptr<algorithm> make_allreduce_recursive_doubling() {
  return std::make_unique<allreduce_recursive_doubling>();
}

}  // namespace troupe::detail
