// allgather_recursive_doubling — allgather in log2 n steps for a power of
// two of ranks, every rank's block the same size. Ranks take their places
// host by host, so the partners of the first steps share a host and small
// blocks cross between hosts in the last steps only (the ring crosses at
// each of its n - 1 steps, Bruck's steps at each of theirs).
//
// Terms: ranks stand in places 0 .. n-1 host by host (ring_order); slot q
// of a buffer of n blocks will hold the block of the rank at place q.
// Before step k (k = 1, 2, 4, ... < n) the rank at place p holds slots
// [p & ~(k-1), +k).
// Step 0: slot p is this rank's input.
// Step k: send those k slots to the rank at place p ^ k and receive its k
//   slots into [(p ^ k) & ~(k-1), +k).
// End: slot q goes to the output block of the rank at place q.

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class allgather_recursive_doubling final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    const int r = ctx.rank();
    const ring_order order{ctx.topology(), n};  // host by host
    const int p = order.position(r);
    auto at = [&](int place) { return order.shifted(r, place - p); };
    const auto count = call.counts.empty() ? 0 : call.counts[0];
    auto slots = [&](int first, int k) { return slots_.flat_slice(count * first, count * k); };
    if (!started_) {
      started_ = true;
      // A buffer of the algorithm's own: what is sent to a rank of this
      // process stays valid after this rank's call returned.
      slots_ = tensor::empty({count * n}, call.output.scalar_type());
      slots(p, 1).copy_from(call.input);
    }
    for (; k_ < n; k_ <<= 1, sent_ = false) {
      const auto id = static_cast<std::uint32_t>(k_);
      const int partner = p ^ k_;
      if (!sent_) {
        // Slots this rank holds are never written again: shared as they are.
        ctx.send(at(partner), id, slots(p & ~(k_ - 1), k_));
        sent_ = true;
      }
      auto in = ctx.take(at(partner), id);
      if (!in) return false;
      place(call, *in, slots(partner & ~(k_ - 1), k_), at(partner), id);
    }
    for (int q = 0; q < n; ++q) call.output.flat_slice(count * at(q), count).copy_from(slots(q, 1));
    return true;
  }

 private:
  bool started_ = false, sent_ = false;
  int k_ = 1;
  tensor slots_;
};

}  // namespace

std::unique_ptr<algorithm> make_allgather_recursive_doubling() {
  return std::make_unique<allgather_recursive_doubling>();
}

}  // namespace troupe::detail
