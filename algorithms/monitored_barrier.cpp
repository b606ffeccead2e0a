// monitored_barrier — a barrier through rank 0 that names who is missing.
//
// Terms: rank 0 is the monitor; "arrival" is step 0 (rank -> 0), "release" is
// step 1 (0 -> rank).
// Step 1: every other rank sends its arrival to rank 0, then waits for release.
// Step 2: rank 0 collects arrivals; when all arrived it releases everyone.
// On timeout rank 0 reports the missing ranks: the first one only, or every
// one with wait_all_ranks (c10d's monitored_barrier semantics).

#include <vector>

#include "algorithms/algorithm.hpp"

namespace troupe::detail {
namespace {

class monitored_barrier final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    const int n = ctx.size();
    const int r = ctx.rank();
    if (r != 0) {  // Step 1
      if (!sent_) {
        ctx.send(0, 0, tensor{});
        sent_ = true;
      }
      return ctx.take(0, 1).has_value();
    }
    if (arrived_.empty()) {  // Step 2
      arrived_.assign(static_cast<std::size_t>(n), false);
      arrived_[0] = true;
    }
    bool all = true;
    for (int p = 1; p < n; ++p)
      if (!arrived_[static_cast<std::size_t>(p)])
        all &= (arrived_[static_cast<std::size_t>(p)] = ctx.take(p, 0).has_value());
    if (!all) return false;
    for (int p = 1; p < n; ++p) ctx.send(p, 1, tensor{});
    return true;
  }

  std::string on_timeout(op_context& ctx) override {
    if (ctx.rank() != 0) return "no release from rank 0";
    std::vector<int> missing;
    for (std::size_t p = 1; p < arrived_.size(); ++p)
      if (!arrived_[p]) missing.push_back(static_cast<int>(p));
    if (!ctx.call().wait_all_ranks) missing.resize(std::min<std::size_t>(missing.size(), 1));
    std::string list;
    for (auto p : missing) list += (list.empty() ? "" : ", ") + std::to_string(p);
    return (missing.size() == 1 ? "Rank " : "Ranks ") + list + " failed to pass monitored_barrier";
  }

 private:
  bool sent_ = false;
  std::vector<bool> arrived_;
};

}  // namespace

std::unique_ptr<algorithm> make_monitored_barrier() {
  return std::make_unique<monitored_barrier>();
}

}  // namespace troupe::detail
