// broadcast_binomial — binomial-tree broadcast from `root`.
//
// Terms: v = (rank - root) mod size is the rank's position in a tree rooted
// at v = 0. In round k (mask = 2^k) every v < mask that has the data sends it
// to v + mask. So v receives once, from v - lowbit(v), then sends to v + m for
// every m < lowbit(v) (all m for the root), in decreasing m — the farthest
// subtree first.
// Step 1: the root copies its buffer once into a shared payload.
// Step 2: a non-root waits for its parent's payload and copies it out.
// Step 3: forward the same payload (unchanged, never copied) to the children.

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
    tensor data;
    if (v == 0) {
      data = fresh_copy(call.input);  // Step 1
    } else {
      const int parent = ring(v - low + call.root, 0, n);
      auto in = ctx.take(parent, 0);  // Step 2
      if (!in) return false;
      check_payload(call, *in, call.output.numel(), parent, 0);
      call.output.copy_from(*in);
      data = std::move(*in);
    }
    for (int m = low >> 1; m >= 1; m >>= 1)  // Step 3
      if (v + m < n) ctx.send(ring(v + m + call.root, 0, n), 0, data);
    return true;
  }
};

}  // namespace

std::unique_ptr<algorithm> make_broadcast_binomial() {
  return std::make_unique<broadcast_binomial>();
}

}  // namespace troupe::detail
