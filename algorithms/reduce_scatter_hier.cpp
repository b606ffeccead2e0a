// reduce_scatter_hier — reduce_scatter across hosts whose bytes cross each
// host's link once per direction (the ring, host by host, carries (n-1)/n
// of the input over each host's link: at 2 hosts of 2 ranks 1.5 times
// what must cross).
//
// Terms: H hosts, L ranks on a host (striped: the same L on every host;
// leaders: any); "local index" a rank's place among its host's ranks;
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
// Leaders (hosts of any sizes, or small inputs, where one message per host
// beats L of them):
//   Step 1: each rank sends its contribution to its host's first rank (the
//     leader), which reduces them in local order and packs the sum's blocks
//     host by host (each host's ranks' blocks in local order).
//   Step 2: the leaders reduce-scatter those (as the columns above): each
//     ends with its host's blocks.
//   Step 3: each leader divides AVG and sends each rank of its host its
//     block, which it receives straight into its output.
// Slices (striped, inputs of several TROUPE_HIER_SEGMENT, as allreduce_hier): the
// steps run on slice s of every block at once for each s (in_slices), so
// the first slices cross between the hosts while the next are reduced.

#include <memory>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/slices.hpp"
#include "algorithms/sub_context.hpp"

namespace troupe::detail {

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
      sub_ = make_across_hosts(sub_call_, c.hosts, t.model());
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

class reduce_scatter_leaders final : public algorithm {
 public:
  static constexpr std::uint32_t to_leader = 0, from_leader = 1;   // steps 1 and 3
  static constexpr std::uint32_t across = sub_context::step_span;  // step 2's messages

  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const auto& t = ctx.topology();
    const host_columns c{t, ctx.rank()};
    const int leader = c.peer(0);
    if (c.me != 0)  // its contribution to the leader, its block back
      return follow_leader(
          ctx, leader, to_leader, from_leader, [&] { return own_contribution(call, call.input); },
          started_);
    const auto sum_op = partial_op(call.op);
    const auto numel = call.input.numel();
    if (!started_) {
      started_ = true;
      parts_.assign(static_cast<std::size_t>(c.local), tensor{});
      parts_[0] = own_contribution(call, call.input);
    }
    if (!sub_) {  // Step 1: the host's sum, packed host by host
      if (!reduce_in_order(ctx, c.mine, to_leader, numel, sum_op, parts_, sum_)) return false;
      auto packed = tensor::empty({numel}, call.input.scalar_type());
      reorder_by_host(t, call.counts, sum_, packed, true);
      sub_call_.counts = host_totals(t, call.counts);
      // Step 2: the leaders, across hosts.
      const auto host = static_cast<std::size_t>(t.host_of[static_cast<std::size_t>(ctx.rank())]);
      sub_call_.code = op_code::reduce_scatterv;
      sub_call_.name = call.name;
      sub_call_.op = sum_op;
      sub_call_.input = packed;
      sub_call_.output = mine_ = tensor::empty({sub_call_.counts[host]}, call.input.scalar_type());
      sub_call_.timeout = call.timeout;
      sub_ctx_ = std::make_unique<sub_context>(ctx, c.column(0), sub_call_, across);
      sub_ = make_across_hosts(sub_call_, c.hosts, t.model());
    }
    if (!sub_->progress(*sub_ctx_)) return false;
    // Step 3: each rank of the host its block.
    finish_reduction(call, mine_, ctx.size());
    std::int64_t at = 0;
    for (int q = 0; q < c.local; ++q) {
      const auto n = call.counts[static_cast<std::size_t>(c.peer(q))];
      const auto part = mine_.flat_slice(at, n);
      if (q == 0)
        call.output.copy_from(part);
      else
        ctx.send(c.peer(q), from_leader, part);
      at += n;
    }
    return true;
  }

 private:
  bool started_ = false;
  std::vector<tensor> parts_;  // step 1: the host's contributions
  tensor sum_;                 // the host's sum
  tensor mine_;                // the host's blocks of the whole sum, in local order
  collective_call sub_call_;
  std::unique_ptr<sub_context> sub_ctx_;
  std::unique_ptr<algorithm> sub_;
};

}  // namespace

std::unique_ptr<algorithm> make_reduce_scatter_hier(bool striped, std::uint64_t bytes,
                                                    const cost_model& m) {
  if (!striped) return std::make_unique<reduce_scatter_leaders>();
  if (const int k = hier_segments(bytes, m); k > 1)
    return std::make_unique<in_slices>(
        k, reduce_scatter_hier::spans, [k](const collective_call&, int s) {
          return in_slices::part{nullptr, std::make_unique<reduce_scatter_hier>(k, s)};
        });
  return std::make_unique<reduce_scatter_hier>(1, 0);
}

}  // namespace troupe::detail
