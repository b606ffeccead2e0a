// broadcast_scatter_allgather — van de Geijn's broadcast: the root scatters
// the buffer over a binomial tree, then a ring allgather assembles it
// everywhere. About 2·N bytes leave each rank, where the binomial tree's
// root sends the whole buffer to each of its log2(n) children: for large
// buffers at many ranks.
//
// Terms: v = (rank - root) mod n is the rank's place; the buffer is cut into
// n blocks (chunk_range) and block b belongs to place b. A subtree of the
// binomial tree (see broadcast_binomial) holds consecutive places, so the
// blocks it needs are one contiguous range.
// Scatter (message 0): v receives blocks [v, v + lowbit(v)) (clipped to n)
//   from v - lowbit(v), then sends [v + m, v + 2m) to v + m for every
//   m < lowbit(v), the largest first. The root reads its input; the others
//   receive into their output and forward from it.
// Allgather (message 1 + s, s = 0 .. n-2): v sends block v - s to v + 1 and
//   receives block v - s - 1 from v - 1, into its output. The root, which
//   holds every block, sends from its input and drops what it receives.
// Forwarded slices of the output are copies where the transport does not
// copy before send returns (to_send): later blocks land beside them.

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class broadcast_scatter_allgather final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size(), v = ring(ctx.rank(), -call.root, n);
    if (numel_ < 0) {  // the first call
      numel_ = call.output.numel();
      parts_ = n;
      while (low_ < n && (v & low_) == 0) low_ <<= 1;  // the root's: n rounded up
    }
    const bool root = v == 0;
    const auto& data = root ? call.input : call.output;  // where this rank's blocks are
    auto rank_at = [&](int place) { return ring(place + call.root, 0, n); };
    if (!scattered_) {
      if (!root) {
        const int parent = rank_at(v - low_);
        auto in = ctx.take(parent, 0);
        if (!in) return false;
        place(call, *in, blocks(call.output, v, std::min(v + low_, n)), parent, 0);
      }
      for (int m = low_ >> 1; m >= 1; m >>= 1)
        if (v + m < n) {
          const int child = rank_at(v + m);
          ctx.send(child, 0, to_send(ctx, child, blocks(data, v + m, std::min(v + 2 * m, n))));
        }
      scattered_ = true;
    }
    const int right = rank_at(v + 1), left = rank_at(v - 1);
    for (; step_ < n - 1; ++step_) {
      const auto id = static_cast<std::uint32_t>(1 + step_);
      if (!sent_) {
        const int b = ring(v - step_, 0, n);
        ctx.send(right, id, to_send(ctx, right, blocks(data, b, b + 1)));
        sent_ = true;
      }
      auto in = ctx.take(left, id);
      if (!in) return false;
      const int b = ring(v - step_ - 1, 0, n);
      if (!root) place(call, *in, blocks(call.output, b, b + 1), left, id);
      sent_ = false;
    }
    return true;
  }

 private:
  /// Blocks [lo, hi) of `t`, the whole buffer.
  tensor blocks(const tensor& t, int lo, int hi) const {
    const auto start = [&](int b) {
      return b >= parts_ ? numel_ : chunk_range(numel_, parts_, b).first;
    };
    return t.flat_slice(start(lo), start(hi) - start(lo));
  }

  bool scattered_ = false;
  bool sent_ = false;
  int step_ = 0;
  int low_ = 1;    // lowest set bit of v (n rounded up to a power of two for the root)
  int parts_ = 1;  // blocks: one per rank
  std::int64_t numel_ = -1;
};

}  // namespace

std::unique_ptr<algorithm> make_broadcast_scatter_allgather() {
  return std::make_unique<broadcast_scatter_allgather>();
}

}  // namespace troupe::detail
