// reduce_binomial — binomial-tree reduction to `root`.
//
// Terms: v = (rank - root) mod size; the tree is the broadcast tree reversed.
// For mask = 1, 2, 4, ...: if v has bit `mask` set it sends its accumulator to
// parent v - mask and is done; otherwise, if child v + mask exists, it
// receives the child's accumulator and combines it with its own. Children are
// taken in increasing mask order, so the reduction order is fixed.
// Step 1: acc = own contribution (pre-scaled for PREMUL_SUM).
// Step 2: per mask, combine a child's accumulator into a new acc, or send acc up.
// Step 3: at the root, finish (AVG) and write the output.

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class reduce_binomial final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    const int v = ring(ctx.rank(), -call.root, n);
    if (!started_) {
      started_ = true;
      acc_ = own_contribution(call, call.input);  // Step 1
    }
    for (; mask_ < n; mask_ <<= 1) {  // Step 2
      if (v & mask_) {
        const int parent = ring(v - mask_ + call.root, 0, n);
        ctx.send(parent, mask_, acc_.is_same(call.input) ? fresh_copy(acc_) : acc_);
        return true;
      }
      if (v + mask_ >= n) continue;
      const int child = ring(v + mask_ + call.root, 0, n);
      auto in = ctx.take(child, mask_);
      if (!in) return false;
      check_payload(call, *in, call.input.numel(), child, mask_);
      acc_ = combine_received(ctx, child, call.op, acc_, *in);
    }
    if (acc_.is_same(call.input) && !call.input.is_same(call.output))
      acc_ = fresh_copy(acc_);        // never scale the caller's input in place
    finish_reduction(call, acc_, n);  // Step 3
    if (!acc_.is_same(call.output)) call.output.copy_from(acc_);
    return true;
  }

 private:
  bool started_ = false;
  int mask_ = 1;
  tensor acc_;
};

}  // namespace

std::unique_ptr<algorithm> make_reduce_binomial() {
  return std::make_unique<reduce_binomial>();
}

}  // namespace troupe::detail
