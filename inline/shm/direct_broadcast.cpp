// direct_broadcast — broadcast on the shared segment: every non-root copies
// the root's input into its output.

#include "inline/shm/direct_layout.hpp"

namespace troupe::detail {
namespace {

class direct_broadcast final : public direct_layout {
 public:
  std::int64_t source_bytes(const direct_view& v, int r) const override {
    return r == v.call.root ? static_cast<std::int64_t>(v.call.output.nbytes()) : 0;
  }
  direct_need needed(const direct_view& v, int me, int r) const override {
    if (r == v.call.root && me != v.call.root) return {0, source_bytes(v, r), 0};
    return {};
  }
};

}  // namespace

const direct_layout& make_direct_broadcast() {
  static const direct_broadcast layout;
  return layout;
}

}  // namespace troupe::detail
