// reduce_scatter_ring — ring reduce-scatter of variable-size blocks
// (reduce_scatterv).
//
// Terms: the input holds sum(counts) elements on every rank; block b
// (counts[b] elements at offset sum(counts[<b])) is reduced into rank b's
// output. mine[b] is this rank's contribution (pre-scaled for PREMUL_SUM).
// Step 0: send a copy of mine[r-1] to the right.
// Step s (0 .. size-2): receive the partial of block r-s-2 from the left and
//   combine it with mine into a new buffer; send it on, except after the
//   last step, when the block is r's own: finish it (AVG) and write the output.

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class reduce_scatter_ring final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    const int r = ctx.rank();
    const ring_order order{ctx.topology(), n};  // host by host
    const auto offsets = offsets_of(call.counts);
    if (!started_) {
      started_ = true;
      mine_ = own_contribution(call, call.input);
      auto own = [&](int b) { return mine_.flat_slice(offsets[b], call.counts[b]); };
      if (n == 1) {
        auto result = fresh_copy(own(0));
        finish_reduction(call, result, n);
        call.output.copy_from(result);
        return true;
      }
      const int right = order.shifted(r, 1);
      ctx.send(right, 0, to_send(ctx, right, own(order.shifted(r, -1))));
    }
    for (; step_ < n - 1; ++step_) {
      const int left = order.shifted(r, -1);
      auto in = ctx.take(left, step_);
      if (!in) return false;
      const int b = order.shifted(r, -step_ - 2);
      check_payload(call, *in, call.counts[b], left, step_);
      auto partial =
          combine_received(ctx, left, call.op, mine_.flat_slice(offsets[b], call.counts[b]), *in);
      if (step_ + 1 < n - 1) {
        ctx.send(order.shifted(r, 1), step_ + 1, std::move(partial));
      } else {
        finish_reduction(call, partial, n);
        call.output.copy_from(partial);
      }
    }
    return true;
  }

 private:
  bool started_ = false;
  int step_ = 0;
  tensor mine_;
};

}  // namespace

std::unique_ptr<algorithm> make_reduce_scatter_ring() {
  return std::make_unique<reduce_scatter_ring>();
}

}  // namespace troupe::detail
