// reduce_chain — a pipelined chain toward `root` through every rank, host
// by host: the broadcast chain reversed. Each rank receives a segment's
// partial result from the rank after it, combines its own segment in and
// passes the sum to the rank before it as soon as it is made. Every host's
// link carries the buffer once in and once out (the binomial tree's root
// host receives it once per level of hosts), so a large reduce across
// several hosts runs at the link's rate, plus the fill: the first
// segment's hops up the chain.
//
// Through the hosts' leaders (reduce_chain_leaders), each host's first
// rank takes the sums of the next host's first rank and of a chain of its
// own host's other ranks: a path of hosts + ranks per host - 1 ranks, not
// one of every rank (broadcast_chain's leaders, reversed).
//
// Terms: the links are chain_links(topology, size, root, leaders)
// (topology.hpp): in chain_order (the root, its host's other ranks, then
// the other hosts' ranks host after host) each rank's parent and children;
// partial results travel from the children to the parents. The buffer is
// cut into chain_segments(bytes, depth) segments (cost_model.hpp, 64 KiB to
// 1 MiB; depth: the ranks on the longest path); message j is segment j's
// partial result.
// Step 1: acc = own contribution (pre-scaled for PREMUL_SUM).
// Step 2: for each segment in order: wait for each child's segment and
//   combine them into this rank's own (own first, then the children in the
//   links' order: a fixed order), and send the result to the parent, or,
//   at the root, finish it (AVG's division) into the output.

#include <vector>

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class reduce_chain final : public algorithm {
 public:
  explicit reduce_chain(bool through_leaders) : through_leaders_(through_leaders) {}

  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    if (segs_ == 0) {  // Step 1
      auto links = chain_links(ctx.topology(), n, call.root, through_leaders_);
      toward_root_ = links.parent[static_cast<std::size_t>(ctx.rank())];
      from_ = std::move(links.children[static_cast<std::size_t>(ctx.rank())]);
      segs_ = chain_segments(call.input.nbytes(), links.depth);
      acc_ = own_contribution(call, call.input);
    }
    const auto numel = call.input.numel();
    for (; seg_ < segs_; ++seg_) {  // Step 2
      const auto j = static_cast<std::uint32_t>(seg_);
      const auto [off, len] = chunk_range(numel, segs_, seg_);
      if (kid_ == 0) part_ = acc_.flat_slice(off, len);
      for (; kid_ < from_.size(); ++kid_) {  // each child's, in the links' order
        const int c = from_[kid_];
        auto in = ctx.take(c, j);
        if (!in) return false;
        check_payload(call, *in, len, c, j);
        part_ = combine_received(ctx, c, call.op, part_, *in);
      }
      kid_ = 0;
      tensor part = std::move(part_);
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
  bool through_leaders_;
  int segs_ = 0;           // 0: not started
  int seg_ = 0;            // the next segment to make
  std::size_t kid_ = 0;    // the next child whose segment seg_ to combine
  tensor part_;            // segment seg_'s sum so far
  int toward_root_ = -1;   // the parent (-1: the root)
  std::vector<int> from_;  // the children
  tensor acc_;
};

}  // namespace

std::unique_ptr<algorithm> make_reduce_chain(bool through_leaders) {
  return std::make_unique<reduce_chain>(through_leaders);
}

}  // namespace troupe::detail
