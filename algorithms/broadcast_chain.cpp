// broadcast_chain — a pipelined chain from `root` through every rank, host
// by host: each rank receives the buffer in segments from the rank before
// it and forwards each segment to the rank after it as soon as it came.
// Every host's link carries the buffer once in and once out (the binomial
// tree's root sends it once per subtree, scatter-allgather's about 1.6
// times at 4 hosts), so a large broadcast across several hosts runs at the
// link's rate, plus the fill: the first segment's hops down the chain.
//
// Terms: the chain is chain_order(topology, size, root) (topology.hpp): the
// root, its host's other ranks, then the other hosts' ranks host after
// host. The buffer is cut into chain_segments(bytes, size) segments
// (cost_model.hpp, 64 KiB to 1 MiB); message j is segment j.
// Root: sends every segment to the next rank: its own memory where the
//   transport copies it before send returns, else slices of one fresh copy.
// Others: for each segment in order, wait for the previous rank's, copy it
//   into place and forward the same payload (unchanged, never copied) to
//   the next rank, if any.

#include <algorithm>
#include <vector>

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class broadcast_chain final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    if (segs_ == 0) {
      const auto order = chain_order(ctx.topology(), n, call.root);
      const auto at = std::find(order.begin(), order.end(), ctx.rank()) - order.begin();
      prev_ = at > 0 ? order[static_cast<std::size_t>(at - 1)] : -1;
      next_ = at + 1 < n ? order[static_cast<std::size_t>(at + 1)] : -1;
      segs_ = chain_segments(call.output.nbytes(), n);
    }
    const auto numel = call.output.numel();
    auto segment = [&](const tensor& t, int j) {
      const auto [off, len] = chunk_range(numel, segs_, j);
      return t.flat_slice(off, len);
    };
    if (ctx.rank() == call.root) {
      if (next_ < 0) return true;
      const tensor from = ctx.copies_on_send(next_) ? call.input : fresh_copy(call.input);
      for (int j = 0; j < segs_; ++j)
        ctx.send(next_, static_cast<std::uint32_t>(j), segment(from, j));
      return true;
    }
    for (; seg_ < segs_; ++seg_) {
      const auto j = static_cast<std::uint32_t>(seg_);
      auto in = ctx.take(prev_, j);
      if (!in) return false;
      place(call, *in, segment(call.output, seg_), prev_, j);
      if (next_ >= 0) ctx.send(next_, j, *in);
    }
    return true;
  }

 private:
  int segs_ = 0;  // 0: not started
  int seg_ = 0;   // the next segment to receive
  int prev_ = -1, next_ = -1;
};

}  // namespace

std::unique_ptr<algorithm> make_broadcast_chain() {
  return std::make_unique<broadcast_chain>();
}

}  // namespace troupe::detail
