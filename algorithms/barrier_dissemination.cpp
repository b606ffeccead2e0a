// barrier_dissemination — the dissemination barrier (Hensgen, Finkel, Manber).
//
// Terms: round k = 0 .. ceil(log2 size)-1, distance d = 2^k.
// Round k: send an empty message to r + d, then wait for the one from r - d.
// After the last round every rank has (transitively) heard from every other.

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class barrier_dissemination final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    const int n = ctx.size();
    const int r = ctx.rank();
    for (; (1 << round_) < n; ++round_) {
      const int d = 1 << round_;
      const auto step = static_cast<std::uint32_t>(round_);
      if (!sent_) {
        ctx.send(ring(r, d, n), step, tensor{});
        sent_ = true;
      }
      if (!ctx.take(ring(r, -d, n), step)) return false;
      sent_ = false;
    }
    return true;
  }

 private:
  int round_ = 0;
  bool sent_ = false;
};

}  // namespace

std::unique_ptr<algorithm> make_barrier_dissemination() {
  return std::make_unique<barrier_dissemination>();
}

}  // namespace troupe::detail
