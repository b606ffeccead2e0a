// reduce_hier — reduction to `root` across hosts whose bytes cross each
// host's link once: within each host to its leader, then among the leaders
// (as allreduce_hier's leaders and broadcast_hier do).
//
// Terms: a host's leader is the root on the root's host, its first rank on
// the others; "local order" the host's ranks in ascending group rank.
// Step 1 (within the host): each rank but the leader sends its contribution
//   (pre-scaled for PREMUL_SUM) to the leader, which reduces them all, its
//   own among them, in local order.
// Step 2 (across hosts): the leaders reduce the hosts' sums to the root
//   (reduce_binomial among them, one per host in host order).
// Step 3: the root finishes (AVG) and writes the output.

#include <memory>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/sub_context.hpp"

namespace troupe::detail {

std::unique_ptr<algorithm> make_reduce_binomial();

namespace {

constexpr std::uint32_t within = 0;                       // step 1
constexpr std::uint32_t across = sub_context::step_span;  // step 2's messages

class reduce_hier final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const auto numel = call.input.numel();
    const auto sum_op = partial_op(call.op);
    const auto& t = ctx.topology();
    const host_leaders leaders{t, call.root};
    const int r = ctx.rank(), host = t.host_of[static_cast<std::size_t>(r)];
    const auto& mine = t.ranks_on[static_cast<std::size_t>(host)];
    const int leader = leaders.of(host);
    if (!started_) {  // Step 1: send, or gather the host's contributions
      started_ = true;
      contribution_ = own_contribution(call, call.input);
      if (r != leader) {
        ctx.send(leader, within, to_send(ctx, leader, contribution_));
        return true;
      }
      parts_.assign(mine.size(), tensor{});
      parts_[static_cast<std::size_t>(t.local_index(r))] = contribution_;
    }
    if (!reduced_) {  // Step 1: the leader reduces, in local order
      if (!reduce_in_order(ctx, mine, within, numel, sum_op, parts_, sum_)) return false;
      reduced_ = true;
      // Step 2: the leaders, one per host in host order; the root's host's is the root.
      sub_call_.code = op_code::reduce;
      sub_call_.name = call.name;
      sub_call_.op = sum_op;
      sub_call_.root = leaders.root_host;
      sub_call_.input = sub_call_.output = sum_;
      sub_call_.timeout = call.timeout;
      sub_ctx_ = std::make_unique<sub_context>(ctx, leaders.all(), sub_call_, across);
      sub_ = make_reduce_binomial();
    }
    if (!sub_->progress(*sub_ctx_)) return false;
    if (r == call.root) {  // Step 3
      finish_reduction(call, sum_, ctx.size());
      call.output.copy_from(sum_);
    }
    return true;
  }

 private:
  bool started_ = false, reduced_ = false;
  tensor contribution_, sum_;
  std::vector<tensor> parts_;
  collective_call sub_call_;
  std::unique_ptr<sub_context> sub_ctx_;
  std::unique_ptr<algorithm> sub_;
};

}  // namespace

std::unique_ptr<algorithm> make_reduce_hier() {
  return std::make_unique<reduce_hier>();
}

}  // namespace troupe::detail
