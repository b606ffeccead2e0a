// broadcast_chain — a pipelined chain from `root` through every rank, host
// by host: each rank receives the buffer in segments from the rank before
// it and forwards each segment to the rank after it as soon as it came.
// Every host's link carries the buffer once in and once out (the binomial
// tree's root sends it once per subtree, scatter-allgather's about 1.6
// times at 4 hosts), so a large broadcast across several hosts runs at the
// link's rate, plus the fill: the first segment's hops down the chain.
//
// Through the hosts' leaders (broadcast_chain_leaders), the chain passes
// each host's first rank only, which hands every segment to the next host
// first and then to a chain of its host's other ranks: a path of hosts +
// ranks per host - 1 ranks, not one of every rank (at thousands of ranks
// the fill of a hop per rank costs more than the link's time for the
// buffer).
//
// Terms: the links are chain_links(topology, size, root, leaders)
// (topology.hpp): in chain_order (the root, its host's other ranks, then
// the other hosts' ranks host after host) each rank's parent and children.
// The buffer is cut into chain_segments(bytes, depth) segments
// (cost_model.hpp, 64 KiB to 1 MiB; depth: the ranks on the longest path);
// message j is segment j.
// Root: sends every segment to each child: its own memory where every
//   child's transport copies it before send returns, else slices of one
//   fresh copy.
// Others: for each segment in order, wait for the parent's, copy it into
//   place and forward the same payload (unchanged, never copied) to each
//   child, if any.

#include <vector>

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class broadcast_chain final : public algorithm {
 public:
  explicit broadcast_chain(bool through_leaders) : through_leaders_(through_leaders) {}

  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    if (segs_ == 0) {
      auto links = chain_links(ctx.topology(), n, call.root, through_leaders_);
      prev_ = links.parent[static_cast<std::size_t>(ctx.rank())];
      next_ = std::move(links.children[static_cast<std::size_t>(ctx.rank())]);
      segs_ = chain_segments(call.output.nbytes(), links.depth);
    }
    const auto numel = call.output.numel();
    auto segment = [&](const tensor& t, int j) {
      const auto [off, len] = chunk_range(numel, segs_, j);
      return t.flat_slice(off, len);
    };
    if (ctx.rank() == call.root) {
      bool copied = true;  // every child's transport copies before send returns
      for (int c : next_) copied = copied && ctx.copies_on_send(c);
      const tensor from = copied ? call.input : fresh_copy(call.input);
      for (int j = 0; j < segs_; ++j)
        for (int c : next_) ctx.send(c, static_cast<std::uint32_t>(j), segment(from, j));
      return true;
    }
    for (; seg_ < segs_; ++seg_) {
      const auto j = static_cast<std::uint32_t>(seg_);
      auto in = ctx.take(prev_, j);
      if (!in) return false;
      place(call, *in, segment(call.output, seg_), prev_, j);
      for (int c : next_) ctx.send(c, j, *in);
    }
    return true;
  }

 private:
  bool through_leaders_;
  int segs_ = 0;  // 0: not started
  int seg_ = 0;   // the next segment to receive
  int prev_ = -1;
  std::vector<int> next_;
};

}  // namespace

std::unique_ptr<algorithm> make_broadcast_chain(bool through_leaders) {
  return std::make_unique<broadcast_chain>(through_leaders);
}

}  // namespace troupe::detail
