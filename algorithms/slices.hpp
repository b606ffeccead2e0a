#pragma once
// in_slices — one algorithm run on k slices of its call at once, each on
// steps of its own over the whole group, so that while one slice's bytes
// cross between hosts another's are reduced or shared within them (the
// striped hierarchies over slow links: a slice's messages leave in the
// order its steps are sent, the first slice's first). A slice runs on a
// call of its own (the allreduce's: a slice of the buffer), or on the
// whole call, reading its part itself (allgather's and reduce_scatter's
// slices of every block).

#include <functional>
#include <memory>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/sub_context.hpp"

namespace troupe::detail {

class in_slices final : public algorithm {
 public:
  /// Slice s: its call (null: the whole call) and its algorithm.
  struct part {
    std::unique_ptr<collective_call> call;
    std::unique_ptr<algorithm> run;
  };
  using make_fn = std::function<part(const collective_call& whole, int s)>;

  /// k slices, each using `spans` of sub_context's step spans.
  in_slices(int k, std::uint32_t spans, make_fn make)
      : k_(k), spans_(spans), make_(std::move(make)) {}

  bool progress(op_context& ctx) override {
    if (slices_.empty()) {
      std::vector<int> everyone(static_cast<std::size_t>(ctx.size()));
      for (int r = 0; r < ctx.size(); ++r) everyone[static_cast<std::size_t>(r)] = r;
      // Every slice runs on the whole group: the same hosts.
      const auto hosts = std::make_shared<const group_topology>(ctx.topology());
      for (int s = 0; s < k_; ++s) {
        slice sl;
        sl.run = make_(ctx.call(), s);
        sl.ctx = std::make_unique<sub_context>(
            ctx, everyone, sl.run.call ? *sl.run.call : ctx.call(),
            static_cast<std::uint32_t>(s) * spans_ * sub_context::step_span);
        sl.ctx->set_topology(hosts);
        slices_.push_back(std::move(sl));
      }
    }
    bool all = true;
    for (auto& sl : slices_) {
      if (!sl.done) sl.done = sl.run.run->progress(*sl.ctx);
      all = all && sl.done;
    }
    return all;
  }

 private:
  struct slice {
    in_slices::part run;
    std::unique_ptr<sub_context> ctx;
    bool done = false;
  };
  int k_;
  std::uint32_t spans_;
  make_fn make_;
  std::vector<slice> slices_;
};

}  // namespace troupe::detail
