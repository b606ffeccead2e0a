#pragma once
// halving — the recursive halving reduce-scatter that Rabenseifner's
// allreduce (allreduce_rabenseifner.cpp) and reduce_scatter_halving.cpp
// share: the fold of the ranks beyond a power of two, then log2(p) steps
// that each halve the range of blocks a rank reduces.
//
// Terms: p is the largest power of two <= n and extra = n - p; the first
// 2·extra ranks pair up (2i, 2i+1) and 2i stands for both; "virtual rank" v
// numbers the p ranks that take part. The buffer is cut into p blocks at
// `bounds` (block b: elements [bounds[b], bounds[b+1])); a rank holds the
// partial sums of a range [lo, hi) of blocks in `acc`.
// Step 0 (fold, when n is not a power of two; message 0): rank 2i+1 sends
//   its contribution to 2i, which combines them (its own first); 2i+1 is
//   then `folded` and waits for what its algorithm sends it back.
// Halving steps s = 0 .. log2(p)-1 (message 1 + s): with mask = p >> (s+1),
//   v and v XOR mask split their common range in two; the lower virtual rank
//   keeps the lower half. Each sends its partial sums of the half it gives
//   up and combines the partner's of the half it keeps (the lower virtual
//   rank's first). After the last, v holds block v fully reduced (not yet
//   finished: AVG is the caller's to divide).

#include <cstdint>
#include <vector>

#include "algorithms/algorithm.hpp"

namespace troupe::detail {

class recursive_halving {
 public:
  static constexpr std::uint32_t fold_step = 0;

  /// Sets up for a group of `ctx.size()` ranks over `contribution` (this
  /// rank's, never written: combines make new buffers); `bounds_of(p,
  /// extra)` gives the p + 1 block bounds. The folded rank sends at once.
  template <class Bounds>
  void start(op_context& ctx, tensor contribution, Bounds&& bounds_of) {
    const int n = ctx.size(), r = ctx.rank();
    acc = std::move(contribution);
    while (p * 2 <= n) p *= 2;
    while ((1 << levels) < p) ++levels;
    extra = n - p;
    hi = p;
    bounds = bounds_of(p, extra);
    if (r < 2 * extra && r % 2 == 1) {  // folds into r - 1
      ctx.send(r - 1, fold_step, to_send(ctx, r - 1, acc));
      folded = true;
    } else {
      v = r < 2 * extra ? r / 2 : r - extra;
      fold_pending_ = r < 2 * extra;
    }
  }
  /// The fold and the halving steps: true once block v is reduced in `acc`
  /// (never for a folded rank), false while a message is missing.
  bool run(op_context& ctx);
  /// The group rank of virtual rank v's partner across `mask`.
  int partner_of(int mask) const {
    const int pv = v ^ mask;
    return pv < extra ? 2 * pv : pv + extra;
  }
  /// The elements of blocks [lo, hi) of `t`, which holds blocks from `base` on.
  tensor blocks(const tensor& t, int base, int from, int to) const {
    const auto at = [&](int b) { return bounds[static_cast<std::size_t>(b)]; };
    return t.flat_slice(at(from) - at(base), at(to) - at(from));
  }

  int p = 1, levels = 0, extra = 0, v = 0;
  int lo = 0, hi = 1;  // the blocks this rank holds
  bool folded = false;
  tensor acc;                        // partial sums of blocks [lo, hi)
  std::vector<std::int64_t> bounds;  // p + 1 block bounds
  int step = 0;                      // the halving step this rank is at

 private:
  bool fold_pending_ = false, sent_ = false;
};

}  // namespace troupe::detail
