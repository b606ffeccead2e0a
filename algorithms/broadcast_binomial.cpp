// broadcast_binomial — binomial-tree broadcast from `root`, pipelined in
// segments.
//
// Terms: v = (rank - root) mod size is the rank's position in a tree rooted
// at v = 0. In round k (mask = 2^k) every v < mask that has the data sends it
// to v + mask. So v receives from v - lowbit(v), then sends to v + m for
// every m < lowbit(v) (all m for the root), in decreasing m — the farthest
// subtree first. The buffer is cut into segments of about 1 MiB (one for
// small buffers); message j is segment j, so a rank forwards segment j while
// segment j+1 is on its way to it.
// Root: sends every segment to every child, segment by segment: its own
//   memory where the transport copies it before send returns, else one
//   fresh copy of the buffer whose slices are shared.
// Others: for each segment in order, wait for the parent's, copy it out and
//   forward the same payload (unchanged, never copied) to the children.

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class broadcast_binomial final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    const int v = ring(ctx.rank(), -call.root, n);
    // Lowest set bit of v: the round in which v receives (n rounded up for the root).
    int low = 1;
    while (low < n && (v & low) == 0) low <<= 1;
    const auto numel = call.output.numel();
    const int segs = segments_of(numel, call.output.scalar_type());
    auto children = [&](std::uint32_t j, const tensor& data, const tensor& shared) {
      for (int m = low >> 1; m >= 1; m >>= 1)
        if (v + m < n) {
          const int child = ring(v + m + call.root, 0, n);
          ctx.send(child, j, ctx.copies_on_send(child) ? data : shared);
        }
    };
    if (v == 0) {
      tensor copy;  // for children that share the payload (this process)
      for (int m = low >> 1; m >= 1; m >>= 1)
        if (v + m < n && !ctx.copies_on_send(ring(v + m + call.root, 0, n))) {
          copy = fresh_copy(call.input);
          break;
        }
      for (int j = 0; j < segs; ++j) {
        const auto [off, len] = chunk_range(numel, segs, j);
        children(static_cast<std::uint32_t>(j), call.input.flat_slice(off, len),
                 copy.defined() ? copy.flat_slice(off, len) : tensor{});
      }
      return true;
    }
    const int parent = ring(v - low + call.root, 0, n);
    for (; next_ < segs; ++next_) {
      const auto j = static_cast<std::uint32_t>(next_);
      auto in = ctx.take(parent, j);
      if (!in) return false;
      const auto [off, len] = chunk_range(numel, segs, next_);
      place(call, *in, call.output.flat_slice(off, len), parent, j);
      children(j, *in, *in);
    }
    return true;
  }

 private:
  int next_ = 0;  // the next segment to receive
};

}  // namespace

std::unique_ptr<algorithm> make_broadcast_binomial() {
  return std::make_unique<broadcast_binomial>();
}

}  // namespace troupe::detail
