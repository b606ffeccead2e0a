// gather_direct — every rank sends its block straight to the root (gatherv).
//
// Terms: block b is rank b's input, counts[b] elements, placed at offset
// sum(counts[<b]) of the root's output.
// Step 1: a non-root sends a copy of its input to the root and is done.
// Step 2: the root copies its own block, then each peer's block as it arrives.

#include <vector>

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class gather_direct final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    const int r = ctx.rank();
    if (r != call.root) {
      ctx.send(call.root, 0, to_send(ctx, call.root, call.input));  // Step 1
      return true;
    }
    const auto offsets = offsets_of(call.counts);
    auto block = [&](int b) { return call.output.flat_slice(offsets[b], call.counts[b]); };
    if (!started_) {  // Step 2
      started_ = true;
      if (!call.input.is_same(block(r))) block(r).copy_from(call.input);
      done_.assign(static_cast<std::size_t>(n), false);
      done_[static_cast<std::size_t>(r)] = true;
    }
    return collect_from_peers(ctx, done_,
                              [&](int p, const tensor& in) { place(call, in, block(p), p, 0); });
  }

 private:
  bool started_ = false;
  std::vector<bool> done_;
};

}  // namespace

std::unique_ptr<algorithm> make_gather_direct() {
  return std::make_unique<gather_direct>();
}

}  // namespace troupe::detail
