// allgather_bruck — allgather in ceil(log2 n) steps, for small blocks at
// many ranks (the ring takes n-1 steps); every rank's block the same size.
//
// Terms: rank r keeps a buffer of n slots whose slot i will hold rank
// (r + i) mod n's block; "have" counts the slots filled (from 0).
// Step 0: slot 0 is this rank's input.
// Step k (k = 1, 2, 4, ... while k < n): send slots [0, m) to rank r - k
//   and receive rank r + k's slots [0, m) into slots [k, k + m), where
//   m = min(k, n - k).
// End: slot i goes to the output at rank (r + i) mod n's place (two runs).

#include <algorithm>

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class allgather_bruck final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    const int r = ctx.rank();
    const auto count = call.counts.empty() ? 0 : call.counts[0];
    if (!started_) {
      started_ = true;
      slots_ = tensor::empty({count * n}, call.output.scalar_type());
      slots_.flat_slice(0, count).copy_from(call.input);
    }
    for (; k_ < n; k_ <<= 1, sent_ = false) {
      const int m = std::min(k_, n - k_);
      const auto id = static_cast<std::uint32_t>(k_);
      const int to = ring(r, -k_, n), from = ring(r, k_, n);
      if (!sent_) {
        // Slots below k are never written again: shared as they are.
        ctx.send(to, id, slots_.flat_slice(0, count * m));
        sent_ = true;
      }
      auto in = ctx.take(from, id);
      if (!in) return false;
      place(call, *in, slots_.flat_slice(count * k_, count * m), from, id);
    }
    // Slot i is rank r + i's block: two runs of the output.
    call.output.flat_slice(count * r, count * (n - r))
        .copy_from(slots_.flat_slice(0, count * (n - r)));
    call.output.flat_slice(0, count * r).copy_from(slots_.flat_slice(count * (n - r), count * r));
    return true;
  }

 private:
  bool started_ = false, sent_ = false;
  int k_ = 1;
  tensor slots_;
};

}  // namespace

std::unique_ptr<algorithm> make_allgather_bruck() {
  return std::make_unique<allgather_bruck>();
}

}  // namespace troupe::detail
