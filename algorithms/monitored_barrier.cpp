// monitored_barrier — a barrier through rank 0 that names who is missing.
//
// Terms: rank 0 is the monitor; "arrival" is step 0 (rank -> 0), "verdict" is
// step 1 (0 -> rank): an empty message releases the rank, a list of ranks
// says the barrier failed and who did not arrive.
// Step 1: every other rank sends its arrival to rank 0, then waits for the
//         verdict (as c10d, only rank 0 enforces the barrier's timeout: the
//         others wait long enough to hear its verdict).
// Step 2: rank 0 collects arrivals; when all arrived it releases everyone.
// On timeout rank 0 reports the missing ranks — the first one only, or every
// one with wait_all_ranks, or every one when the timeout had expired before
// the call (c10d's monitored_barrier) — and sends the verdict to the ranks
// that arrived, which fail at once naming rank 0's report.

#include <vector>

#include "algorithms/algorithm.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {
namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::string list;
  for (auto p : ranks) list += (list.empty() ? "" : ", ") + std::to_string(p);
  return (ranks.size() == 1 ? "Rank " : "Ranks ") + list;
}

std::string arrived_but(int rank, const std::string& why) {
  return "Rank " + std::to_string(rank) +
         " successfully reached monitoredBarrier, but received errors while waiting for "
         "send/recv from rank 0: " +
         why;
}

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
      auto verdict = ctx.take(0, 1);
      if (!verdict) return false;
      if (verdict->defined() && verdict->numel() > 0)
        throw error(errc::timeout,
                    arrived_but(r, "rank 0 reports: " + rank_list(verdict->to_vector<int>()) +
                                       " failed to pass monitoredBarrier"));
      return true;
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
    if (ctx.rank() != 0) return arrived_but(ctx.rank(), "no verdict from rank 0 in time");
    // Ranks that did not arrive yet (every one when the progress never ran).
    std::vector<int> missing;
    for (int p = 1; p < ctx.size(); ++p)
      if (arrived_.empty() || !arrived_[static_cast<std::size_t>(p)]) missing.push_back(p);
    // The ranks that arrived hear why the barrier failed.
    auto verdict = tensor::from_vector<int>(missing);
    for (int p = 1; p < ctx.size(); ++p)
      if (!arrived_.empty() && arrived_[static_cast<std::size_t>(p)]) ctx.send(p, 1, verdict);
    if (ctx.call().timeout.count() <= 0)
      return "Rank 0 timed out in monitoredBarrier (its timeout had expired); " +
             rank_list(missing) + " had not arrived";
    if (!ctx.call().wait_all_ranks && missing.size() > 1) missing.resize(1);
    return rank_list(missing) + " failed to pass monitoredBarrier";
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
