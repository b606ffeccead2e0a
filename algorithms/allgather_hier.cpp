// allgather_hier — allgather across hosts whose bytes cross each host's link
// once per direction (the ring, host by host, carries (n-1)/n of the output
// over each host's link: at 2 hosts of 2 ranks 1.5 times what must cross).
//
// Terms: H hosts, L ranks on a host (striped: the same L on every host;
// leaders: any); "local index" a rank's place among its host's ranks;
// "column j" the ranks of local index j, one on each host, in host order;
// block b is rank b's input, counts[b] elements at offset sum(counts[<b])
// of the output (allgatherv: blocks may differ in size).
// Striped:
//   Step 1 (across hosts): each column allgathers its blocks (the algorithm
//     select.cpp chooses for H ranks, one per host) into a buffer of the
//     column's own, host by host: the L columns of a host cross its link
//     at once, each over its own connection, and each block crosses once
//     to every other host.
//   Step 2 (within the host): each rank copies its column's blocks into
//     the output and sends them to its host's other ranks, a message a
//     block (message h: the block of host h's rank), which the receiving
//     thread writes straight into their place in the output where it can.
//   Every message of step 2 is a slice of the column's buffer, which
//   nothing writes once step 1 ended: shared as it is.
// Leaders (hosts of any sizes, or small blocks, where one message per host
// beats L of them):
//   Step 1: each rank sends its block to its host's first rank (the
//     leader), which places its host's blocks, in local order, in a buffer.
//   Step 2: the leaders allgather those buffers (as the columns above).
//   Step 3: each leader writes every block into its output and sends the
//     output to its host's ranks, which receive it straight into theirs.
// Slices (striped, buffers of several TROUPE_HIER_SEGMENT, as
// allreduce_hier): the steps run on slice s of every block at once for each
// s (in_slices), so the first slices are shared within the hosts while the
// last still cross.

#include <memory>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/slices.hpp"
#include "algorithms/sub_context.hpp"

namespace troupe::detail {

namespace {

class allgather_hier final : public algorithm {
 public:
  static constexpr std::uint32_t within = 0;  // step 2: message h (host h's block)
  static constexpr std::uint32_t across = sub_context::step_span;  // step 1's messages
  static constexpr std::uint32_t spans = 2;                        // of sub_context's

  /// Runs on slice `s` of `k` of every block.
  allgather_hier(int k, int s) : k_(k), s_(s) {}

  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const auto& t = ctx.topology();
    const int r = ctx.rank();
    const host_columns c{t, r};
    const block_slices slices{call.counts, k_, s_};  // this slice's part of each block
    const auto block = [&](int b) { return slices.of(call.output, b); };
    const auto input = [&] { return slices.of(call.input, r, true); };
    if (!started_) {  // Step 1: this rank's column, across hosts
      started_ = true;
      std::int64_t total = 0;
      for (int h = 0; h < c.hosts; ++h)
        total += sub_call_.counts.emplace_back(slices.count(c.at(h, c.me)));
      sub_call_.code = op_code::allgatherv;
      sub_call_.name = call.name;
      sub_call_.input = input();
      sub_call_.output = column_ = tensor::empty({total}, call.output.scalar_type());
      sub_call_.timeout = call.timeout;
      sub_ctx_ = std::make_unique<sub_context>(ctx, c.column(c.me), sub_call_, across);
      sub_ = make_across_hosts(sub_call_, c.hosts, t.model());
      // Its first progress has copied the input: from here on the output
      // may be written even where the input overlaps it.
      across_done_ = sub_->progress(*sub_ctx_);
      // Step 2's blocks from the host's other ranks go straight into place.
      for (int q = 0; q < c.local; ++q)
        if (q != c.me)
          for (int h = 0; h < c.hosts; ++h)
            receive_into(ctx, call, c.peer(q), within + static_cast<std::uint32_t>(h),
                         block(c.at(h, q)));
    }
    if (!across_done_ && !(across_done_ = sub_->progress(*sub_ctx_))) return false;
    if (!shared_) {  // Step 2: the column's blocks, into place and to the host
      shared_ = true;
      const auto column_offsets = offsets_of(sub_call_.counts);
      for (int h = 0; h < c.hosts; ++h) {
        const auto part = column_.flat_slice(column_offsets[static_cast<std::size_t>(h)],
                                             sub_call_.counts[static_cast<std::size_t>(h)]);
        if (auto out = block(c.at(h, c.me)); !out.is_same(input())) out.copy_from(part);
        for (int q = 0; q < c.local; ++q)
          if (q != c.me) ctx.send(c.peer(q), within + static_cast<std::uint32_t>(h), part);
      }
    }
    for (; taken_ < (c.local - 1) * c.hosts; ++taken_) {
      const int q = taken_ / c.hosts + (taken_ / c.hosts >= c.me ? 1 : 0), h = taken_ % c.hosts;
      const int peer = c.peer(q);
      const auto step = within + static_cast<std::uint32_t>(h);
      auto in = ctx.take(peer, step);
      if (!in) return false;
      if (in->defined()) place(call, *in, block(c.at(h, q)), peer, step);
    }
    return true;
  }

 private:
  int k_, s_;
  bool started_ = false, across_done_ = false, shared_ = false;
  int taken_ = 0;  // step 2's messages taken, peer by peer, host by host
  tensor column_;  // the column's blocks, host by host
  collective_call sub_call_;
  std::unique_ptr<sub_context> sub_ctx_;
  std::unique_ptr<algorithm> sub_;
};

class allgather_leaders final : public algorithm {
 public:
  static constexpr std::uint32_t to_leader = 0, from_leader = 1;   // steps 1 and 3
  static constexpr std::uint32_t across = sub_context::step_span;  // step 2's messages

  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const auto& t = ctx.topology();
    const host_columns c{t, ctx.rank()};
    const int leader = c.peer(0);
    if (c.me != 0)  // its block to the leader, the output back
      return follow_leader(
          ctx, leader, to_leader, from_leader, [&] { return call.input; }, started_);
    // Rank b's place in its host's buffer, and its block of the output.
    const auto in_host = [&](int q) {
      std::int64_t off = 0;
      for (int p = 0; p < q; ++p) off += call.counts[static_cast<std::size_t>(c.peer(p))];
      return host_.flat_slice(off, call.counts[static_cast<std::size_t>(c.peer(q))]);
    };
    if (!started_) {  // Step 1: the host's blocks, in local order
      started_ = true;
      sub_call_.counts = host_totals(t, call.counts);
      const auto host = static_cast<std::size_t>(t.host_of[static_cast<std::size_t>(ctx.rank())]);
      host_ = tensor::empty({sub_call_.counts[host]}, call.output.scalar_type());
      in_host(0).copy_from(call.input);
      for (int q = 1; q < c.local; ++q) receive_into(ctx, call, c.peer(q), to_leader, in_host(q));
    }
    for (; gathered_ < c.local; ++gathered_) {
      if (gathered_ == 0) continue;
      auto in = ctx.take(c.peer(gathered_), to_leader);
      if (!in) return false;
      if (in->defined()) place(call, *in, in_host(gathered_), c.peer(gathered_), to_leader);
    }
    if (!sub_) {  // Step 2: the leaders, across hosts
      std::int64_t total = 0;
      for (auto n : sub_call_.counts) total += n;
      sub_call_.code = op_code::allgatherv;
      sub_call_.name = call.name;
      sub_call_.input = host_;
      sub_call_.output = all_ = tensor::empty({total}, call.output.scalar_type());
      sub_call_.timeout = call.timeout;
      sub_ctx_ = std::make_unique<sub_context>(ctx, c.column(0), sub_call_, across);
      sub_ = make_across_hosts(sub_call_, c.hosts, t.model());
    }
    if (!sub_->progress(*sub_ctx_)) return false;
    // Step 3: every block to its place, the output to the host's ranks.
    reorder_by_host(t, call.counts, call.output, all_, false);
    for (int q = 1; q < c.local; ++q)
      ctx.send(c.peer(q), from_leader, to_send(ctx, c.peer(q), call.output));
    return true;
  }

 private:
  bool started_ = false;
  int gathered_ = 0;  // step 1: the host's ranks whose block is in place
  tensor host_;       // the host's blocks, in local order
  tensor all_;        // every host's, host by host
  collective_call sub_call_;
  std::unique_ptr<sub_context> sub_ctx_;
  std::unique_ptr<algorithm> sub_;
};

}  // namespace

std::unique_ptr<algorithm> make_allgather_hier(bool striped, std::uint64_t bytes,
                                               const cost_model& m) {
  if (!striped) return std::make_unique<allgather_leaders>();
  if (const int k = hier_segments(bytes, m); k > 1)
    return std::make_unique<in_slices>(
        k, allgather_hier::spans, [k](const collective_call&, int s) {
          return in_slices::part{nullptr, std::make_unique<allgather_hier>(k, s)};
        });
  return std::make_unique<allgather_hier>(1, 0);
}

}  // namespace troupe::detail
