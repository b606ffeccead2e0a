// scatter_direct — the root sends each rank its block directly (scatterv).
//
// Terms: block b of the root's input, counts[b] elements at offset
// sum(counts[<b]), goes to rank b's output.
// Step 1: the root sends a copy of every peer's block and copies its own.
// Step 2: a non-root waits for its block and copies it out.

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class scatter_direct final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    const int r = ctx.rank();
    if (r == call.root) {  // Step 1
      const auto offsets = offsets_of(call.counts);
      for (int p = 0; p < n; ++p) {
        auto block = call.input.flat_slice(offsets[p], call.counts[p]);
        if (p == r) {
          if (!block.is_same(call.output)) call.output.copy_from(block);
        } else {
          ctx.send(p, 0, to_send(ctx, p, block));
        }
      }
      return true;
    }
    auto in = ctx.take(call.root, 0);  // Step 2
    if (!in) return false;
    check_payload(call, *in, call.counts[r], call.root, 0);
    call.output.copy_from(*in);
    return true;
  }
};

}  // namespace

std::unique_ptr<algorithm> make_scatter_direct() {
  return std::make_unique<scatter_direct>();
}

}  // namespace troupe::detail
