#pragma once
// in_slices — one algorithm run on k slices of its call at once, each on
// steps of its own over the whole group, so that while one slice's bytes
// cross between hosts another's are shared or reduced within them (the
// hierarchical allgather and reduce_scatter over slow links: a slice's
// messages leave in the order its steps are sent, the first slice's first).
// Slice s's algorithm reads its part of the call itself (the call is the
// whole one; make(s) says which part).

#include <functional>
#include <memory>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/sub_context.hpp"

namespace troupe::detail {

class in_slices final : public algorithm {
 public:
  /// k slices, each using `spans` of sub_context's step spans.
  in_slices(int k, std::uint32_t spans, std::function<std::unique_ptr<algorithm>(int)> make)
      : k_(k), spans_(spans), make_(std::move(make)) {}

  bool progress(op_context& ctx) override {
    if (slices_.empty()) {
      std::vector<int> everyone(static_cast<std::size_t>(ctx.size()));
      for (int r = 0; r < ctx.size(); ++r) everyone[static_cast<std::size_t>(r)] = r;
      // Every slice runs on the whole group: the same hosts.
      const auto hosts = std::make_shared<const group_topology>(ctx.topology());
      for (int s = 0; s < k_; ++s) {
        slice sl;
        sl.ctx = std::make_unique<sub_context>(
            ctx, everyone, ctx.call(),
            static_cast<std::uint32_t>(s) * spans_ * sub_context::step_span);
        sl.ctx->set_topology(hosts);
        sl.run = make_(s);
        slices_.push_back(std::move(sl));
      }
    }
    bool all = true;
    for (auto& sl : slices_) {
      if (!sl.done) sl.done = sl.run->progress(*sl.ctx);
      all = all && sl.done;
    }
    return all;
  }

 private:
  struct slice {
    std::unique_ptr<sub_context> ctx;
    std::unique_ptr<algorithm> run;
    bool done = false;
  };
  int k_;
  std::uint32_t spans_;
  std::function<std::unique_ptr<algorithm>(int)> make_;
  std::vector<slice> slices_;
};

}  // namespace troupe::detail
