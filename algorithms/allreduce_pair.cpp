// allreduce_pair — allreduce of two ranks up to 1 MiB: each sends its whole
// buffer to the other in segments and reduces locally, one stream each way
// (larger buffers: allreduce_halves).
//
// Terms: the buffer is cut into segments of about 1 MiB (one for small
// buffers), or 128 KiB where the context paces the peer (op_context::paced:
// another host over TCP, a CPU for this rank); "mine" is this rank's
// contribution (pre-scaled for PREMUL_SUM).
// Send: segment j of mine goes to the peer as message j, up to `pair_window`
//   segments ahead of the ones reduced (paced: 2, so neither rank gets more
//   than 256 KiB ahead of what it received: TCP then carries both ways at
//   once without taking its own backlog for losses).
// Reduce: when the peer's segment j arrived, reduce rank 0's and rank 1's
//   segment j in rank order (both ranks, so both get the same bits), finish
//   it (AVG) and write it into the output. Segment j was sent before it is
//   overwritten (in place).
// The ring moves the same N bytes each way (two messages of N/2) but in two
// dependent phases; here reduction overlaps one uninterrupted exchange and
// nothing is copied into the output afterwards.

#include <algorithm>

#include "algorithms/algorithm.hpp"
#include "kernels/reduce_kernels.hpp"

namespace troupe::detail {
namespace {

constexpr int pair_window = 8;  // segments in flight
constexpr std::size_t paced_segment = std::size_t{128} << 10;
constexpr int paced_window = 2;

class allreduce_pair final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int me = ctx.rank(), peer = 1 - ctx.rank();
    if (!started_) {
      started_ = true;
      mine_ = own_contribution(call, call.input);
      const bool paced = ctx.paced(peer);
      segs_ = paced ? segments_of(call.input.numel(), call.input.scalar_type(), paced_segment)
                    : segments_of(call.input.numel(), call.input.scalar_type());
      window_ = paced ? paced_window : pair_window;
    }
    const auto kind = partial_op(call.op).op();
    for (;;) {
      while (sent_ < segs_ && sent_ < reduced_ + window_) {
        auto part = segment(mine_, sent_);
        ctx.send(peer, static_cast<std::uint32_t>(sent_), to_send(ctx, peer, part));
        ++sent_;
      }
      if (reduced_ == segs_) return true;
      auto in = ctx.take(peer, static_cast<std::uint32_t>(reduced_));
      if (!in) return false;
      const auto [off, len] = range(call.input.numel(), reduced_);
      check_payload(call, *in, len, peer, static_cast<std::uint32_t>(reduced_));
      auto out = call.output.flat_slice(off, len);
      const void* srcs[2];
      srcs[me] = mine_.flat_slice(off, len).data();
      srcs[peer] = in->data();
      reduce_many(out.scalar_type(), kind, out.data(), srcs, 2, static_cast<std::size_t>(len));
      finish_reduction(call, out, 2);
      ++reduced_;
    }
  }

 private:
  std::pair<std::int64_t, std::int64_t> range(std::int64_t numel, int j) const {
    return chunk_range(numel, segs_, j);
  }
  tensor segment(const tensor& t, int j) const {
    const auto [off, len] = range(t.numel(), j);
    return t.flat_slice(off, len);
  }

  bool started_ = false;
  int segs_ = 1;
  int window_ = pair_window;
  int sent_ = 0;
  int reduced_ = 0;
  tensor mine_;
};

}  // namespace

std::unique_ptr<algorithm> make_allreduce_pair() {
  return std::make_unique<allreduce_pair>();
}

}  // namespace troupe::detail
