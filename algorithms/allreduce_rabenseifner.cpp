// allreduce_rabenseifner — recursive halving reduce-scatter, then recursive
// doubling allgather (Rabenseifner's algorithm): 2·log2(p) steps like
// recursive doubling's log2(p), but each rank sends about 2·N bytes in all,
// as the ring does, instead of N per step. For middle sizes at many ranks,
// where the ring's 2(n-1) steps cost latency and recursive doubling's whole
// buffers cost bandwidth.
//
// Terms as in halving.hpp (p, extra, virtual ranks, blocks [lo, hi)): the
// buffer is cut into p blocks (chunk_range); block b ends with virtual
// rank b.
// Step 0 and the halving steps s = 0 .. log2(p)-1 (messages 0 and 1 + s):
//   recursive_halving's fold and halving; 2i+1 waits for the result. After
//   the last, v holds block v fully reduced, finishes it (AVG divided) and
//   writes it into the output.
// Doubling steps, in reverse (message 1 + log2(p) + s): v and v XOR mask
//   exchange the ranges they hold, now final, straight from the output;
//   each range doubles until the whole output is filled.
// Last step (unfold): rank 2i sends the result to 2i+1.
// The input is read only up to the first halving step (sent slices are
// copies where the transport does not copy before send returns) and the
// output written only after it, so in-place calls are safe.

#include "algorithms/algorithm.hpp"
#include "algorithms/halving.hpp"

namespace troupe::detail {
namespace {

class allreduce_rabenseifner final : public algorithm {
  static constexpr std::uint32_t unfold_step = 63;

 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int r = ctx.rank();
    if (!started_) {
      started_ = true;
      const auto numel = call.input.numel();
      h_.start(ctx, own_contribution(call, call.input), [numel](int p, int) {
        std::vector<std::int64_t> b;
        for (int i = 0; i < p; ++i) b.push_back(chunk_range(numel, p, i).first);
        b.push_back(numel);
        return b;
      });
    }
    if (h_.folded) {  // the result comes back from r - 1
      auto in = ctx.take(r - 1, unfold_step);
      if (!in) return false;
      place(call, *in, call.output, r - 1, unfold_step);
      return true;
    }
    if (!h_.run(ctx)) return false;
    if (!reduced_) {
      // Block v is reduced (acc is the input itself only when n == 1).
      auto& acc = h_.acc;
      if (overlaps(acc, call.input) && !acc.is_same(call.output)) acc = fresh_copy(acc);
      finish_reduction(call, acc, ctx.size());
      auto out = h_.blocks(call.output, 0, h_.lo, h_.hi);
      if (!acc.is_same(out)) out.copy_from(acc);
      acc = tensor{};
      reduced_ = true;
      doubling_ = h_.levels - 1;
    }
    if (!double_up(ctx)) return false;
    if (r < 2 * h_.extra) ctx.send(r + 1, unfold_step, to_send(ctx, r + 1, call.output));
    return true;
  }

 private:
  /// The doubling steps, in reverse of the halving ones: true once the
  /// whole output is filled.
  bool double_up(op_context& ctx) {
    auto& call = ctx.call();
    for (; doubling_ >= 0; --doubling_) {
      const int s = doubling_;
      const int mask = h_.p >> (s + 1);
      const int partner = h_.partner_of(mask);
      const bool lower = (h_.v & mask) == 0;
      const int lo = h_.lo, hi = h_.hi;
      const int other_lo = lower ? hi : lo - (hi - lo);
      const int other_hi = lower ? hi + (hi - lo) : lo;
      const auto id = static_cast<std::uint32_t>(1 + h_.levels + s);
      if (!sent_) {
        ctx.send(partner, id, to_send(ctx, partner, h_.blocks(call.output, 0, lo, hi)));
        sent_ = true;
      }
      auto in = ctx.take(partner, id);
      if (!in) return false;
      place(call, *in, h_.blocks(call.output, 0, other_lo, other_hi), partner, id);
      h_.lo = lower ? lo : other_lo;
      h_.hi = lower ? other_hi : hi;
      sent_ = false;
    }
    return true;
  }

  bool started_ = false, reduced_ = false, sent_ = false;
  int doubling_ = 0;  // the doubling step this rank is at (counting down)
  recursive_halving h_;
};

}  // namespace

std::unique_ptr<algorithm> make_allreduce_rabenseifner() {
  return std::make_unique<allreduce_rabenseifner>();
}

}  // namespace troupe::detail
