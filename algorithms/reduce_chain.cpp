// reduce_chain — a pipelined chain toward `root` through every rank, host
// by host: the broadcast chain reversed. Each rank receives a segment's
// partial result from the rank after it, combines its own segment in and
// passes the sum to the rank before it as soon as it is made. Every host's
// link carries the buffer once in and once out (the binomial tree's root
// host receives it once per level of hosts), so a large reduce across
// several hosts runs at the link's rate, plus the fill: the first
// segment's hops up the chain.
//
// Terms: the chain is chain_order(topology, size, root) (topology.hpp): the
// root, its host's other ranks, then the other hosts' ranks host after
// host; partial results travel from its last rank to the root. The buffer
// is cut into chain_segments(bytes, size) segments (cost_model.hpp, 64 KiB
// to 1 MiB); message j is segment j's partial result.
// Step 1: acc = own contribution (pre-scaled for PREMUL_SUM).
// Step 2: for each segment in order: the last rank sends its own segment
//   to the rank before it; the others wait for the next rank's segment,
//   combine their own with it (own first, then the chain's, a fixed order)
//   and send the result on, or, at the root, finish it (AVG's division)
//   into the output.

#include <algorithm>

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class reduce_chain final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    if (segs_ == 0) {  // Step 1
      const auto order = chain_order(ctx.topology(), n, call.root);
      const auto at = std::find(order.begin(), order.end(), ctx.rank()) - order.begin();
      toward_root_ = at > 0 ? order[static_cast<std::size_t>(at - 1)] : -1;
      from_tail_ = at + 1 < n ? order[static_cast<std::size_t>(at + 1)] : -1;
      segs_ = chain_segments(call.input.nbytes(), n);
      acc_ = own_contribution(call, call.input);
    }
    const auto numel = call.input.numel();
    for (; seg_ < segs_; ++seg_) {  // Step 2
      const auto j = static_cast<std::uint32_t>(seg_);
      const auto [off, len] = chunk_range(numel, segs_, seg_);
      tensor part = acc_.flat_slice(off, len);
      if (from_tail_ >= 0) {
        auto in = ctx.take(from_tail_, j);
        if (!in) return false;
        check_payload(call, *in, len, from_tail_, j);
        part = combine_received(ctx, from_tail_, call.op, part, *in);
      }
      if (toward_root_ >= 0) {
        // The caller's memory only where the transport copies it first.
        ctx.send(toward_root_, j,
                 overlaps(part, call.input) ? to_send(ctx, toward_root_, part) : part);
        continue;
      }
      if (overlaps(part, call.input) && !call.input.is_same(call.output))
        part = fresh_copy(part);  // never scale the caller's input in place
      finish_reduction(call, part, n);
      auto out = call.output.flat_slice(off, len);
      if (!part.is_same(out)) out.copy_from(part);
    }
    return true;
  }

 private:
  int segs_ = 0;  // 0: not started
  int seg_ = 0;   // the next segment to make
  int toward_root_ = -1, from_tail_ = -1;
  tensor acc_;
};

}  // namespace

std::unique_ptr<algorithm> make_reduce_chain() {
  return std::make_unique<reduce_chain>();
}

}  // namespace troupe::detail
