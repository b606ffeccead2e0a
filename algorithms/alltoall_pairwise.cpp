// alltoall_pairwise — pairwise exchange of variable-size blocks (alltoallv).
//
// Terms: counts[p] elements of the input (at offset sum(counts[<p])) go to
// rank p; recv_counts[p] elements arrive from rank p at offset
// sum(recv_counts[<p]) of the output.
// Step 1: in rounds i = 1 .. size-1 send a copy of the block for rank r+i
//   (so at each round every rank talks to a different peer); copy the own
//   block locally.
// Step 2: copy each peer's block into place as it arrives.

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
    const auto recv_offsets = offsets_of(call.recv_counts);
    auto out_block = [&](int p) {
      return call.output.flat_slice(recv_offsets[p], call.recv_counts[p]);
    };
    if (!started_) {  // Step 1
      started_ = true;
      const auto send_offsets = offsets_of(call.counts);
      for (int i = 1; i < n; ++i) {
        const int p = ring(r, i, n);
        ctx.send(p, 0, to_send(ctx, p, call.input.flat_slice(send_offsets[p], call.counts[p])));
      }
      auto own = call.input.flat_slice(send_offsets[r], call.counts[r]);
      if (own.numel() != call.recv_counts[r])
        throw error(errc::invalid_argument,
                    call.name + ": this rank sends itself " + std::to_string(own.numel()) +
                        " elements but expects to receive " + std::to_string(call.recv_counts[r]));
      if (!own.is_same(out_block(r))) out_block(r).copy_from(fresh_copy(own));
      done_.assign(static_cast<std::size_t>(n), false);
      done_[static_cast<std::size_t>(r)] = true;
    }
    return collect_from_peers(ctx, done_, [&](int p, const tensor& in) {  // Step 2
      check_payload(call, in, call.recv_counts[p], p, 0);
      out_block(p).copy_from(in);
    });
  }

 private:
  bool started_ = false;
  std::vector<bool> done_;
};

}  // namespace

std::unique_ptr<algorithm> make_alltoall_pairwise() {
  return std::make_unique<alltoall_pairwise>();
}

}  // namespace troupe::detail
