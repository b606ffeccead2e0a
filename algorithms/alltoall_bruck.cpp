// alltoall_bruck — alltoall of even splits in ceil(log2 n) steps, for small
// blocks at many ranks (the pairwise exchange sends n-1 messages per rank,
// n^2 in all). Only where every rank passed no split sizes
// (collective_call::bruck_alltoall, which the fingerprint carries).
//
// Terms: c elements go from every rank to every rank. Rank r keeps n slots
// of c elements; slot i holds a block that has i more ranks to travel
// (forward) before it reaches the rank it is for.
// Step 0: slot i is this rank's block for rank (r + i) mod n.
// Step k (k = 1, 2, 4, ... while k < n): the slots with bit k set go,
//   packed, to rank r + k; the same slots of rank r - k arrive in their
//   place. A block moves forward by the bits of its slot, one bit a step.
// End: slot i holds rank (r - i) mod n's block for this rank.

#include <cstring>

#include "algorithms/algorithm.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {
namespace {

class alltoall_bruck final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const int n = ctx.size();
    const int r = ctx.rank();
    const std::int64_t c = call.counts.empty() ? 0 : call.counts.front();
    if (!started_) {  // Step 0: a rotation (also what makes in place safe)
      started_ = true;
      slots_ = tensor::empty({c * n}, call.output.scalar_type());
      // Slot i is block r + i: two runs of the input.
      slots_.flat_slice(0, c * (n - r)).copy_from(call.input.flat_slice(c * r, c * (n - r)));
      slots_.flat_slice(c * (n - r), c * r).copy_from(call.input.flat_slice(0, c * r));
    }
    // Blocks are copied by memcpy (flat host buffers): a tensor slice per
    // block of a few bytes cost more than the bytes (n log n of them).
    const auto bytes = static_cast<std::size_t>(c) * slots_.element_size();
    auto* slots = static_cast<std::byte*>(slots_.data());
    for (; k_ < n; k_ <<= 1, sent_ = false) {
      // The slots with bit k set, in order, are the message's blocks.
      const auto id = static_cast<std::uint32_t>(k_);
      const std::int64_t m = slots_with_bit(n, k_);
      if (!sent_) {
        auto pack = tensor::empty({c * m}, slots_.scalar_type());  // never written once sent
        auto* to = static_cast<std::byte*>(pack.data());
        for (int i = k_, j = 0; i < n && bytes > 0; ++i)
          if (i & k_) std::memcpy(to + bytes * j++, slots + bytes * i, bytes);
        ctx.send(ring(r, k_, n), id, std::move(pack));
        sent_ = true;
      }
      const int from = ring(r, -k_, n);
      auto in = ctx.take(from, id);
      if (!in) return false;
      check_payload(call, *in, c * m, from, id);
      const auto* got = static_cast<const std::byte*>(in->data());
      for (int i = k_, j = 0; i < n && bytes > 0; ++i)
        if (i & k_) std::memcpy(slots + bytes * i, got + bytes * j++, bytes);
    }
    // Checked only now: a rank whose output is not its input's size
    // disagrees with the others' fingerprints (they then all fail alike);
    // where every rank's is so, every rank fails here alike.
    const std::int64_t back = call.recv_counts.empty() ? 0 : call.recv_counts.front();
    if (back != c)
      throw error(errc::invalid_argument,
                  std::string(call.name) + ": this rank sends every rank " + std::to_string(c) +
                      " elements but expects to receive " + std::to_string(back) +
                      " from each (its input and output differ in size)");
    auto* out = static_cast<std::byte*>(call.output.data());
    for (int i = 0; i < n && bytes > 0; ++i)  // End: the inverse rotation
      std::memcpy(out + bytes * ring(r, -i, n), slots + bytes * i, bytes);
    return true;
  }

 private:
  bool started_ = false, sent_ = false;
  int k_ = 1;
  tensor slots_;
};

}  // namespace

std::unique_ptr<algorithm> make_alltoall_bruck() {
  return std::make_unique<alltoall_bruck>();
}

}  // namespace troupe::detail
