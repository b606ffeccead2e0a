// allreduce_direct — one step for small buffers: everyone sends its
// contribution to everyone, then reduces all of them locally.
//
// Terms: mine is this rank's contribution (pre-scaled for PREMUL_SUM); c[r]
// is rank r's contribution as received (c[rank] = mine).
// Step 1: send a copy of mine to every other rank.
// Step 2: when every c[r] arrived, reduce c[0] op c[1] op ... op c[n-1] in
//   rank order (the same order on every rank, so every rank gets bit-identical
//   results), finish (AVG) and write the output.
// One message latency instead of the ring's 2(n-1); it sends (n-1)·N bytes
// per rank instead of 2·N·(n-1)/n, so it is chosen only for small buffers.

#include <vector>

#include "algorithms/algorithm.hpp"
#include "kernels/reduce_kernels.hpp"

namespace troupe::detail {
namespace {

class allreduce_direct final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    if (!started_) {  // Step 1
      started_ = true;
      auto mine = own_contribution(call, call.input);
      parts_.assign(static_cast<std::size_t>(n), tensor{});
      parts_[static_cast<std::size_t>(ctx.rank())] =
          mine.is_same(call.input) ? fresh_copy(mine) : mine;
      done_.assign(static_cast<std::size_t>(n), false);
      done_[static_cast<std::size_t>(ctx.rank())] = true;
      for (int p = 0; p < n; ++p)
        if (p != ctx.rank()) ctx.send(p, 0, parts_[static_cast<std::size_t>(ctx.rank())]);
    }
    const bool all = collect_from_peers(ctx, done_, [&](int p, const tensor& in) {
      check_payload(call, in, call.input.numel(), p, 0);
      parts_[static_cast<std::size_t>(p)] = in;
    });
    if (!all) return false;
    // Step 2
    std::vector<const void*> srcs;
    for (auto& t : parts_) srcs.push_back(t.data());
    const auto kind = partial_op(call.op).op();
    auto result = tensor::empty({call.input.numel()}, call.input.scalar_type());
    reduce_many(result.scalar_type(), kind, result.data(), srcs.data(), srcs.size(),
                static_cast<std::size_t>(result.numel()));
    finish_reduction(call, result, n);
    call.output.copy_from(result);
    return true;
  }

 private:
  bool started_ = false;
  std::vector<tensor> parts_;
  std::vector<bool> done_;
};

}  // namespace

std::unique_ptr<algorithm> make_allreduce_direct() {
  return std::make_unique<allreduce_direct>();
}

}  // namespace troupe::detail
