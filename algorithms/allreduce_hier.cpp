// allreduce_hier — allreduce across hosts whose bytes cross each host's
// link once per direction: reduce within the host, allreduce across hosts,
// share within the host again (as NCCL's trees and rings between nodes,
// MPI's HAN and Horovod do).
//
// Terms: H hosts, L ranks on a host, "local index" a rank's place among
// its host's ranks, "part j" the j-th of L chunks of the buffer. A
// "column" is the ranks with one local index, one on each host.
// Striped (every host with the same L):
//   Step 1 (within the host): each rank sends part j of its contribution
//     to its host's rank j and reduces the parts it receives, in local
//     order, into its host's sum of its own part.
//   Step 2 (across hosts): each column allreduces its part (the algorithm
//     select.cpp chooses for H ranks, one per host): the L columns of a
//     host cross its link at once, each over its own connection, and each
//     byte of the host's sum crosses once each way.
//   Step 3 (within the host): each rank sends its reduced part (AVG
//     divided) to every rank of its host, which writes it into its output.
// Leaders (hosts of different L, or small buffers, where one message per
//   host beats L of them):
//   Step 1: each rank sends its contribution to its host's first rank (the
//     leader), which reduces them in local order.
//   Step 2: the leaders allreduce.
//   Step 3: each leader sends the result to its host's ranks.
// Slices (striped, buffers of several TROUPE_HIER_SEGMENT: cost_model.hpp's
//   hier_segments): the buffer's k slices each run the striped steps at
//   once, on steps of their own: while slice s crosses between hosts, slice
//   s+1 is reduced within the host and slice s-1 shared, so the link waits
//   for the host's work only at the first slice and the last.
// Every rank ends with the same bits: each element is reduced on one path,
// and the others copy it.

#include <memory>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/slices.hpp"
#include "algorithms/sub_context.hpp"

namespace troupe::detail {

namespace {

constexpr std::uint32_t within = 0;                         // steps 1 and 3
constexpr std::uint32_t across = sub_context::step_span;    // step 2's messages
constexpr std::uint32_t back = 2 * sub_context::step_span;  // step 3

class allreduce_hier final : public algorithm {
 public:
  explicit allreduce_hier(bool striped) : striped_(striped) {}

  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const auto& t = ctx.topology();
    const int r = ctx.rank();
    const host_columns c{t, r};
    const auto& mine = c.mine;
    const int me = c.me, local = c.local;
    const auto numel = call.input.numel();
    const auto sum_op = partial_op(call.op);
    // What local rank q reduces and hands on: its part (striped) or the
    // whole buffer (a leader); the local ranks this rank sends its parts to
    // in step 1 and takes the result from in step 3 (all, or the leader).
    const auto part = [&](int q) {
      return striped_ ? chunk_range(numel, local, q)
                      : std::pair<std::int64_t, std::int64_t>{0, numel};
    };
    const auto reducer = [&](int q) { return q != me && (striped_ || q == 0); };
    const auto [off, len] = part(me);
    const bool reduces = striped_ || me == 0;
    if (!started_) {  // Step 1: send
      started_ = true;
      contribution_ = own_contribution(call, call.input);
      for (int q = 0; q < local; ++q) {
        if (!reducer(q)) continue;
        const int peer = mine[static_cast<std::size_t>(q)];
        const auto [qo, ql] = part(q);
        ctx.send(peer, within, to_send(ctx, peer, contribution_.flat_slice(qo, ql)));
        // Step 3's part from it arrives straight into the output (posted
        // once the send returned: written out, or handed over).
        receive_into(ctx, call, peer, back, call.output.flat_slice(qo, ql));
      }
      if (reduces) {
        parts_.assign(static_cast<std::size_t>(local), tensor{});
        parts_[static_cast<std::size_t>(me)] = contribution_.flat_slice(off, len);
        // The host's sum lands in the output's part (the input's own part
        // when in place: reduced a chunk at a time) unless the two overlap
        // otherwise; step 2 runs on it there.
        auto into = call.output.flat_slice(off, len);
        const auto& own = parts_[static_cast<std::size_t>(me)];
        if (into.data() == own.data() || !overlaps(into, contribution_)) part_ = into;
      }
    }
    if (reduces && !reduced_) {  // Step 1: reduce, in local order
      if (!reduce_in_order(ctx, mine, within, len, sum_op, parts_, part_)) return false;
      reduced_ = true;
      // Step 2: this rank's column (striped) or the leaders, across hosts.
      sub_call_.code = op_code::allreduce;
      sub_call_.name = call.name;
      sub_call_.op = sum_op;
      sub_call_.input = sub_call_.output = part_;
      sub_call_.timeout = call.timeout;
      sub_ctx_ = std::make_unique<sub_context>(ctx, c.column(striped_ ? me : 0), sub_call_, across);
      sub_ = make_across_hosts(sub_call_, t.hosts(), t.model());
    }
    if (reduces && !across_done_) {
      if (!sub_->progress(*sub_ctx_)) return false;
      across_done_ = true;
      // Step 3: the result, divided for AVG, to the host's ranks.
      finish_reduction(call, part_, ctx.size());
      for (int q = 0; q < local; ++q)
        if (q != me) {
          const int peer = mine[static_cast<std::size_t>(q)];
          ctx.send(peer, back, to_send(ctx, peer, part_));
        }
      if (auto out = call.output.flat_slice(off, len); out.data() != part_.data())
        out.copy_from(part_);
    }
    // Step 3: the other parts (striped), or the whole result (leaders).
    done_.resize(static_cast<std::size_t>(local), false);
    for (int q = 0; q < local; ++q) {
      if (!reducer(q) || done_[static_cast<std::size_t>(q)]) continue;
      const int peer = mine[static_cast<std::size_t>(q)];
      auto in = ctx.take(peer, back);
      if (!in) return false;
      const auto [qo, ql] = part(q);
      if (in->defined()) place(call, *in, call.output.flat_slice(qo, ql), peer, back);
      done_[static_cast<std::size_t>(q)] = true;
    }
    return true;
  }

 private:
  bool striped_;
  bool started_ = false, reduced_ = false, across_done_ = false;
  tensor contribution_, part_;
  std::vector<tensor> parts_;
  std::vector<bool> done_;
  collective_call sub_call_;
  std::unique_ptr<sub_context> sub_ctx_;
  std::unique_ptr<algorithm> sub_;
};

}  // namespace

std::unique_ptr<algorithm> make_allreduce_hier(bool striped, std::uint64_t bytes,
                                               const cost_model& m) {
  // In k slices: each a call of its own on its slice of the buffer, over
  // the hierarchy's three spans (within, across, back).
  if (const int k = striped ? hier_segments(bytes, m) : 1; k > 1)
    return std::make_unique<in_slices>(k, 3, [k](const collective_call& whole, int s) {
      const auto [off, len] = chunk_range(whole.input.numel(), k, s);
      auto call = std::make_unique<collective_call>();
      call->code = op_code::allreduce;
      call->name = whole.name;
      call->op = whole.op;
      call->input = whole.input.flat_slice(off, len);
      call->output = whole.output.flat_slice(off, len);
      call->timeout = whole.timeout;
      return in_slices::part{std::move(call), std::make_unique<allreduce_hier>(true)};
    });
  return std::make_unique<allreduce_hier>(striped);
}

}  // namespace troupe::detail
