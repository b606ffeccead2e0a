// reduce_scatter_halving — reduce-scatter by recursive halving
// (reduce_scatterv): log2(p) steps instead of the ring's n - 1, each rank
// sending about the whole input once in all, as the ring does. For small
// and middle inputs at many ranks (the ring's n(n-1) messages).
//
// Terms as in halving.hpp (p, extra, virtual ranks, blocks [lo, hi)):
// virtual block b holds the blocks of the ranks b stands for (two for
// b < extra, else one), the input's blocks in rank order, so a range of
// virtual blocks is one range of elements.
// Step 0 and the halving steps (messages 0 and 1 + s): recursive_halving's
//   fold and halving; 2i+1 waits for its block. After the last, v holds
//   virtual block v fully reduced.
// Last step (unfold): rank 2i finishes (AVG) both blocks, writes its own
//   and sends 2i+1 its.

#include "algorithms/algorithm.hpp"
#include "algorithms/halving.hpp"

namespace troupe::detail {
namespace {

class reduce_scatter_halving final : public algorithm {
  static constexpr std::uint32_t unfold_step = 63;

 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    const int r = ctx.rank();
    if (!started_) {
      started_ = true;
      if (n == 1) {
        auto result = fresh_copy(own_contribution(call, call.input));
        finish_reduction(call, result, n);
        call.output.copy_from(result);
        return true;
      }
      const auto offsets = offsets_of(call.counts);
      const auto total = call.input.numel();
      h_.start(ctx, own_contribution(call, call.input), [&](int p, int extra) {
        std::vector<std::int64_t> b;  // virtual block i starts at its first rank's block
        for (int i = 0; i < p; ++i)
          b.push_back(offsets[static_cast<std::size_t>(i < extra ? 2 * i : i + extra)]);
        b.push_back(total);
        return b;
      });
    }
    if (h_.folded) {  // its block comes back from r - 1
      auto in = ctx.take(r - 1, unfold_step);
      if (!in) return false;
      place(call, *in, call.output, r - 1, unfold_step);
      return true;
    }
    if (!h_.run(ctx)) return false;
    // Virtual block v is reduced (a buffer of this algorithm's own).
    finish_reduction(call, h_.acc, n);
    const auto own = call.counts[static_cast<std::size_t>(r)];
    call.output.copy_from(h_.acc.flat_slice(0, own));
    if (r < 2 * h_.extra)  // Last step: the folded rank's block
      ctx.send(r + 1, unfold_step, h_.acc.flat_slice(own, h_.acc.numel() - own));
    return true;
  }

 private:
  bool started_ = false;
  recursive_halving h_;
};

}  // namespace

std::unique_ptr<algorithm> make_reduce_scatter_halving() {
  return std::make_unique<reduce_scatter_halving>();
}

}  // namespace troupe::detail
