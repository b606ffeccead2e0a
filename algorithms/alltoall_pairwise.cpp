// alltoall_pairwise — pairwise exchange of variable-size blocks (alltoallv).
//
// Terms: counts[p] elements of the input (at offset sum(counts[<p])) go to
// rank p; recv_counts[p] elements arrive from rank p at offset
// sum(recv_counts[<p]) of the output. Blocks travel in segments of about
// 1 MiB (one for small blocks): message j of a pair is segment j.
// Step 1: in rounds i = 1 .. size-1 send the block for rank r+i (so at each
//   round every rank talks to a different peer), segment by segment: the
//   caller's memory where the transport copies it before send returns, else
//   a copy; copy the own block locally.
// Step 2: copy each peer's segments into place as they arrive (between
//   processes the receiving thread does, as soon as each arrives).

#include <vector>

#include "algorithms/algorithm.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {
namespace {

class alltoall_pairwise final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    const int r = ctx.rank();
    const auto dt = call.output.scalar_type();
    const auto recv_offsets = offsets_of(call.recv_counts);
    if (!started_) {  // Step 1
      started_ = true;
      // Between processes the receiving thread copies each segment into
      // place as it arrives, while this one sends (not in place: a segment
      // could land on bytes still to be sent).
      if (!overlaps(call.input, call.output))
        for (int p = 0; p < n; ++p) {
          if (p == r) continue;
          const auto block = call.output.flat_slice(recv_offsets[p], call.recv_counts[p]);
          const int segs = segments_of(block.numel(), dt);
          for (int j = 0; j < segs; ++j) {
            const auto [off, len] = chunk_range(block.numel(), segs, j);
            const auto step = static_cast<std::uint32_t>(j);
            receive_into(ctx, call, p, step, block.flat_slice(off, len));
          }
        }
      const auto send_offsets = offsets_of(call.counts);
      for (int i = 1; i < n; ++i) {
        const int p = ring(r, i, n);
        const auto block = call.input.flat_slice(send_offsets[p], call.counts[p]);
        const int segs = segments_of(block.numel(), dt);
        for (int j = 0; j < segs; ++j) {
          const auto [off, len] = chunk_range(block.numel(), segs, j);
          ctx.send(p, static_cast<std::uint32_t>(j), to_send(ctx, p, block.flat_slice(off, len)));
        }
      }
      auto own = call.input.flat_slice(send_offsets[r], call.counts[r]);
      if (own.numel() != call.recv_counts[r])
        throw error(errc::invalid_argument, std::string(call.name) + ": this rank sends itself " +
                                                std::to_string(own.numel()) +
                                                " elements but expects to receive " +
                                                std::to_string(call.recv_counts[r]));
      auto mine = call.output.flat_slice(recv_offsets[r], call.recv_counts[r]);
      if (!own.is_same(mine)) mine.copy_from(fresh_copy(own));
      next_.assign(static_cast<std::size_t>(n), 0);
      next_[static_cast<std::size_t>(r)] = -1;  // done
    }
    bool all = true;
    for (int p = 0; p < n; ++p) {  // Step 2
      auto& next = next_[static_cast<std::size_t>(p)];
      if (next < 0) continue;
      const auto block = call.output.flat_slice(recv_offsets[p], call.recv_counts[p]);
      const int segs = segments_of(block.numel(), dt);
      for (; next < segs; ++next) {
        const auto j = static_cast<std::uint32_t>(next);
        auto in = ctx.take(p, j);
        if (!in) break;
        if (!in->defined()) continue;  // copied on arrival
        const auto [off, len] = chunk_range(block.numel(), segs, next);
        place(call, *in, block.flat_slice(off, len), p, j);
      }
      if (next == segs)
        next = -1;
      else
        all = false;
    }
    return all;
  }

 private:
  bool started_ = false;
  std::vector<int> next_;  // per peer: the next segment to receive (-1: all in)
};

}  // namespace

std::unique_ptr<algorithm> make_alltoall_pairwise() {
  return std::make_unique<alltoall_pairwise>();
}

}  // namespace troupe::detail
