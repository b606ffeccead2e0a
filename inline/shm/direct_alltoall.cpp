// direct_alltoall — alltoall on the shared segment: each rank posts its send
// and receive counts in its small slot; rank `me` copies from every rank r
// the block r sends to it, to the place of r's block in its output.

#include <numeric>

#include "inline/shm/direct_layout.hpp"

namespace troupe::detail {
namespace {

class direct_alltoall final : public direct_layout {
 public:
  /// What a rank sends adds up to its input (the splits agree: the call's
  /// agreement checked every pair).
  std::int64_t expected_input(const direct_view& v, int r) const override {
    return source_bytes(v, r);
  }
  std::int64_t source_bytes(const direct_view& v, int r) const override {
    if (v.even >= 0) return v.even * v.size * v.element_bytes;
    const auto* sends = v.splits(r, false);
    return std::accumulate(sends, sends + v.size, std::int64_t{0}) * v.element_bytes;
  }
  direct_need needed(const direct_view& v, int me, int r) const override {
    // Even splits: every block where its rank says, without summing counts
    // (n ranks each summing n ranks' counts up to it would cost n^3 per call).
    if (v.even >= 0) {
      const auto block = v.even * v.element_bytes;
      return {me * block, (me + 1) * block, r * block};
    }
    const auto* sends = v.splits(r, false);
    const auto* recvs = v.splits(me, true);
    const auto from = std::accumulate(sends, sends + me, std::int64_t{0}) * v.element_bytes;
    return {from, from + sends[me] * v.element_bytes,
            std::accumulate(recvs, recvs + r, std::int64_t{0}) * v.element_bytes};
  }
  bool pulls_between_processes() const override { return true; }
};

}  // namespace

const direct_layout& make_direct_alltoall() {
  static const direct_alltoall layout;
  return layout;
}

}  // namespace troupe::detail
