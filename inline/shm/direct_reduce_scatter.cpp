// direct_reduce_scatter — reduce_scatter on the shared segment: rank r
// reduces block r of every rank's input, in rank order (then AVG's
// division), into its output: the bits the message algorithms give.

#include "inline/shm/direct_layout.hpp"

namespace troupe::detail {
namespace {

class direct_reduce_scatter final : public direct_layout {
 public:
  std::int64_t expected_input(const direct_view& v, int) const override { return v.total(); }
  std::int64_t source_bytes(const direct_view& v, int) const override { return v.total(); }
  direct_need needed(const direct_view& v, int me, int) const override {
    return {v.offset(me), v.offset(me) + v.length(me), 0};
  }
  bool reduces() const override { return true; }
  bool pulls_between_processes() const override { return true; }
};

}  // namespace

const direct_layout& make_direct_reduce_scatter() {
  static const direct_reduce_scatter layout;
  return layout;
}

}  // namespace troupe::detail
