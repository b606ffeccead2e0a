// direct_scatter — scatter on the shared segment: rank r copies block r of
// the root's input (at the counts' offset of r) into its output.

#include "inline/shm/direct_layout.hpp"

namespace troupe::detail {
namespace {

class direct_scatter final : public direct_layout {
 public:
  std::int64_t expected_input(const direct_view& v, int r) const override {
    return r == v.call.root ? v.total() : -1;
  }
  std::int64_t source_bytes(const direct_view& v, int r) const override {
    return r == v.call.root ? v.total() : 0;
  }
  direct_need needed(const direct_view& v, int me, int r) const override {
    if (r != v.call.root) return {};
    return {v.offset(me), v.offset(me) + v.length(me), 0};
  }
  bool pulls_between_processes() const override { return true; }
};

}  // namespace

const direct_layout& make_direct_scatter() {
  static const direct_scatter layout;
  return layout;
}

}  // namespace troupe::detail
