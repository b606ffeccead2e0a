// recursive_halving (halving.hpp): the fold and the halving steps.

#include "algorithms/halving.hpp"

namespace troupe::detail {

bool recursive_halving::run(op_context& ctx) {
  auto& call = ctx.call();
  const int r = ctx.rank();
  if (folded) return false;
  if (fold_pending_) {  // Step 0: fold r + 1 in
    auto in = ctx.take(r + 1, fold_step);
    if (!in) return false;
    check_payload(call, *in, acc.numel(), r + 1, fold_step);
    acc = combine_received(ctx, r + 1, call.op, acc, *in);
    fold_pending_ = false;
  }
  for (; step < levels; ++step) {
    const int mask = p >> (step + 1);
    const int partner = partner_of(mask);
    const int mid = lo + (hi - lo) / 2;
    const bool lower = (v & mask) == 0;
    const int keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
    const auto id = static_cast<std::uint32_t>(1 + step);
    if (!sent_) {
      const auto give = lower ? blocks(acc, lo, mid, hi) : blocks(acc, lo, lo, mid);
      ctx.send(partner, id, to_send(ctx, partner, give));
      sent_ = true;
    }
    auto in = ctx.take(partner, id);
    if (!in) return false;
    const auto mine = blocks(acc, lo, keep_lo, keep_hi);
    check_payload(call, *in, mine.numel(), partner, id);
    acc = lower ? combine_received(ctx, partner, call.op, mine, *in) : combine(call.op, *in, mine);
    lo = keep_lo;
    hi = keep_hi;
    sent_ = false;
  }
  return true;
}

}  // namespace troupe::detail
