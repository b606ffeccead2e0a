// direct_gather — allgather and gather on the shared segment: block r of
// the output (at the counts' offset of r) is rank r's whole input, copied
// by every rank (allgather) or by the root alone (gather).

#include "inline/shm/direct_layout.hpp"

namespace troupe::detail {
namespace {

class direct_gather final : public direct_layout {
 public:
  explicit direct_gather(bool to_all) : to_all_(to_all) {}
  std::int64_t expected_input(const direct_view& v, int r) const override { return v.length(r); }
  std::int64_t source_bytes(const direct_view& v, int r) const override { return v.length(r); }
  direct_need needed(const direct_view& v, int me, int r) const override {
    if (!to_all_ && me != v.call.root) return {};
    return {0, v.length(r), v.offset(r)};
  }
  bool pulls_between_processes() const override { return !to_all_; }
  bool pushes_to_root() const override { return !to_all_; }

 private:
  bool to_all_;
};

}  // namespace

const direct_layout& make_direct_gather(bool to_all) {
  static const direct_gather to_all_ranks{true}, to_root{false};
  return to_all ? to_all_ranks : to_root;
}

}  // namespace troupe::detail
