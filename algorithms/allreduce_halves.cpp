// allreduce_halves — allreduce of two ranks on large buffers: each rank
// reduces one half and sends it to the other (a ring of two, pipelined), so
// each reduces N/2 elements instead of N, and between processes the reduction
// runs on the thread that receives while the waiting thread only sends.
//
// Terms: the buffer is cut into two chunks; rank r owns chunk r. Each chunk is
// cut into the same number of segments (about 1 MiB each); message (p, j) is
// segment j of phase p. "mine" is this rank's contribution (pre-scaled for
// PREMUL_SUM).
// Phase 0: segment j of mine's chunk `peer` goes to the peer as (0, j).
// Reduce: when the peer's (0, j) arrived, segment j of chunk `me` is reduced
//   from rank 0's and rank 1's contributions in rank order, finished (AVG) and
//   written into the output, then sent to the peer as (1, j).
// Gather: the peer's (1, j) is segment j of chunk `peer`, final: copied into
//   the output.
// Receiving threads (consume_on_arrival, between processes): the handlers of
// every (0, j) and (1, j) are set before anything is sent, so the data
// plane's reader thread reduces and copies as the bytes arrive (while they
// are in its cache), and this thread's part is to send. Neither handler
// writes memory a pending send reads: the chunk reduced here is never sent
// from the input, and the peer's (1, j) exists only after it received all of
// this rank's (0, j), which the kernel had then copied out.
// Small buffers keep allreduce_pair: one message each way instead of two
// dependent ones.

#include "algorithms/algorithm.hpp"
#include "kernels/reduce_kernels.hpp"

namespace troupe::detail {
namespace {

/// Reduces (mine, the peer's `in`) into `out` in rank order and finishes it.
struct segment_reducer {
  segment_reducer(collective_call& c, int rank) : call(&c), kind(partial_op(c.op).op()), me(rank) {}
  void operator()(const tensor& mine, tensor out, const tensor& in, std::uint32_t step) const {
    check_payload(*call, in, out.numel(), 1 - me, step);
    const void* srcs[2];
    srcs[me] = mine.data();
    srcs[1 - me] = in.data();
    reduce_many(out.scalar_type(), kind, out.data(), srcs, 2,
                static_cast<std::size_t>(out.numel()));
    finish_reduction(*call, out, 2);
  }
  collective_call* call;
  reduce_op::kind kind;
  int me;
};

class allreduce_halves final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int me = ctx.rank(), peer = 1 - me;
    if (!started_) {
      started_ = true;
      mine_ = own_contribution(call, call.input);
      segs_ = segments_of(chunk_range(call.input.numel(), 2, 0).second, call.input.scalar_type());
      for (int j = 0; j < segs_; ++j) {
        ctx.consume_on_arrival(peer, id(0, j),
                               [reduce = segment_reducer(call, me), mine = segment(mine_, me, j),
                                out = segment(call.output, me, j), step = id(0, j)](
                                   const tensor& in) { reduce(mine, out, in, step); });
        receive_into(ctx, call, peer, id(1, j), segment(call.output, peer, j));
      }
    }
    for (;;) {
      bool moved = false;
      // Reduced segments of my chunk go to the peer at once.
      while (reduced_ < segs_) {
        auto in = ctx.take(peer, id(0, reduced_));
        if (!in) break;
        auto out = segment(call.output, me, reduced_);
        if (in->defined())
          segment_reducer(call, me)(segment(mine_, me, reduced_), out, *in, id(0, reduced_));
        ctx.send(peer, id(1, reduced_), to_send(ctx, peer, out));
        ++reduced_;
        moved = true;
      }
      // One segment of my contribution to the peer's chunk at a time, so that
      // reduced segments go out between them.
      if (sent_ < segs_) {
        auto part = segment(mine_, peer, sent_);
        ctx.send(peer, id(0, sent_), to_send(ctx, peer, part));
        ++sent_;
        moved = true;
      }
      while (gathered_ < segs_) {
        auto in = ctx.take(peer, id(1, gathered_));
        if (!in) break;
        if (in->defined())
          place(call, *in, segment(call.output, peer, gathered_), peer, id(1, gathered_));
        ++gathered_;
        moved = true;
      }
      if (sent_ == segs_ && reduced_ == segs_ && gathered_ == segs_) return true;
      if (!moved) return false;
    }
  }

 private:
  std::uint32_t id(int phase, int j) const { return static_cast<std::uint32_t>(phase * segs_ + j); }
  /// Segment j of chunk c of `t`.
  tensor segment(const tensor& t, int c, int j) const {
    const auto [off, len] = chunk_range(t.numel(), 2, c);
    const auto [soff, slen] = chunk_range(len, segs_, j);
    return t.flat_slice(off + soff, slen);
  }

  bool started_ = false;
  int segs_ = 1;
  int sent_ = 0;      // phase-0 segments sent
  int reduced_ = 0;   // segments of my chunk reduced and sent
  int gathered_ = 0;  // segments of the peer's chunk in the output
  tensor mine_;
};

}  // namespace

std::unique_ptr<algorithm> make_allreduce_halves() {
  return std::make_unique<allreduce_halves>();
}

}  // namespace troupe::detail
