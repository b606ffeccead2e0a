// reduce_scatter_hier — reduce_scatter across hosts whose bytes cross each
// host's link once per direction (the ring, host by host, carries (n-1)/n
// of the input over each host's link: at 2 hosts of 2 ranks 1.5 times
// what must cross).
//
// Terms: H hosts, each with the same L ranks (other layouts run the ring or
// recursive halving); "local index" a rank's place among its host's ranks;
// "column j" the ranks of local index j, one on each host, in host order;
// block b (counts[b] elements at offset sum(counts[<b]) of the input) is
// reduced into rank b's output. A rank's contribution is its input
// (pre-scaled for PREMUL_SUM).
// Step 1 (within the host): each rank sends each other rank of its host
//   the blocks of that rank's column, a message a block (message h: the
//   block of host h's rank), and reduces what its host sends of its own
//   column's blocks, in local order, into its host's partial sums of them
//   (a buffer of the column's blocks, host by host).
// Step 2 (across hosts): each column reduce-scatters its host partials
//   (the algorithm select.cpp chooses for H ranks, one per host) into the
//   output: the L columns of a host cross its link at once, and each host's
//   sum of a block crosses once, to its rank's host. AVG is divided last.
// Slices (inputs of several TROUPE_HIER_SEGMENT, as allreduce_hier): the
// steps run on slice s of every block at once for each s (in_slices), so
// the first slices cross between the hosts while the next are reduced.

#include <memory>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/slices.hpp"
#include "algorithms/sub_context.hpp"

namespace troupe::detail {

std::unique_ptr<algorithm> make_reduce_scatter_across_hosts(const collective_call& part, int hosts,
                                                            const cost_model& m);

namespace {

class reduce_scatter_hier final : public algorithm {
 public:
  static constexpr std::uint32_t within = 0;  // step 1: message h (host h's block)
  static constexpr std::uint32_t across = sub_context::step_span;  // step 2's messages
  static constexpr std::uint32_t spans = 2;                        // of sub_context's

  /// Runs on slice `s` of `k` of every block.
  reduce_scatter_hier(int k, int s) : k_(k), s_(s) {}

  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const auto& t = ctx.topology();
    const int r = ctx.rank();
    const host_columns c{t, r};
    // This slice's part of each block, and this rank's contribution to
    // block b's (each is taken once).
    const block_slices slices{call.counts, k_, s_};
    const auto block = [&](int b) { return own_contribution(call, slices.of(call.input, b)); };
    auto output = slices.of(call.output, r, true);
    if (!started_) {  // Step 1: the other columns' blocks, to their ranks
      started_ = true;
      for (int q = 0; q < c.local; ++q)
        if (q != c.me)
          for (int h = 0; h < c.hosts; ++h)
            ctx.send(c.peer(q), within + static_cast<std::uint32_t>(h),
                     to_send(ctx, c.peer(q), block(c.at(h, q))));
      std::int64_t total = 0;
      for (int h = 0; h < c.hosts; ++h)
        total += sub_call_.counts.emplace_back(slices.count(c.at(h, c.me)));
      partials_ = tensor::empty({total}, call.input.scalar_type());
    }
    const auto sum_op = partial_op(call.op);
    const auto column_offsets = offsets_of(sub_call_.counts);
    for (; reduced_ < c.hosts; ++reduced_) {  // Step 1: reduce, host by host, in local order
      const int h = reduced_;
      const auto count = sub_call_.counts[static_cast<std::size_t>(h)];
      if (parts_.empty()) {
        parts_.assign(static_cast<std::size_t>(c.local), tensor{});
        parts_[static_cast<std::size_t>(c.me)] = block(c.at(h, c.me));
      }
      auto out = partials_.flat_slice(column_offsets[static_cast<std::size_t>(h)], count);
      if (!reduce_in_order(ctx, c.mine, within + static_cast<std::uint32_t>(h), count, sum_op,
                           parts_, out))
        return false;
    }
    if (!sub_) {  // Step 2: this rank's column, across hosts, into the output
      sub_call_.code = op_code::reduce_scatterv;
      sub_call_.name = call.name;
      sub_call_.op = sum_op;
      sub_call_.input = partials_;
      sub_call_.output = output;
      sub_call_.timeout = call.timeout;
      sub_ctx_ = std::make_unique<sub_context>(ctx, c.column(c.me), sub_call_, across);
      sub_ = make_reduce_scatter_across_hosts(sub_call_, c.hosts, t.model());
    }
    if (!sub_->progress(*sub_ctx_)) return false;
    finish_reduction(call, output, ctx.size());
    return true;
  }

 private:
  int k_, s_;
  bool started_ = false;
  int reduced_ = 0;            // step 1: the hosts whose block of this column is reduced
  tensor partials_;            // the host's sums of the column's blocks, host by host
  std::vector<tensor> parts_;  // step 1: the parts of the block being reduced
  collective_call sub_call_;
  std::unique_ptr<sub_context> sub_ctx_;
  std::unique_ptr<algorithm> sub_;
};

}  // namespace

std::unique_ptr<algorithm> make_reduce_scatter_hier(std::uint64_t bytes, const cost_model& m) {
  if (const int k = hier_segments(bytes, m); k > 1)
    return std::make_unique<in_slices>(
        k, reduce_scatter_hier::spans, [k](const collective_call&, int s) {
          return in_slices::part{nullptr, std::make_unique<reduce_scatter_hier>(k, s)};
        });
  return std::make_unique<reduce_scatter_hier>(1, 0);
}

}  // namespace troupe::detail
