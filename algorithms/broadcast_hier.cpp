// broadcast_hier — broadcast across hosts whose bytes cross each host's
// link once: to one rank of every host first, then within each host.
//
// Terms: the root's host is led by the root, every other host by its
// first rank (the "leaders").
// Step 1 (across hosts): the leaders broadcast from the root (a binomial
//   tree among them, one rank per host).
// Step 2 (within each host): each leader broadcasts to its host's ranks
//   (a binomial tree among them).

#include <memory>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/sub_context.hpp"

namespace troupe::detail {

std::unique_ptr<algorithm> make_broadcast_binomial();

namespace {

class broadcast_hier final : public algorithm {
 public:
  bool progress(op_context& ctx) override {
    auto& call = ctx.call();
    const auto& t = ctx.topology();
    const int r = ctx.rank();
    const host_leaders leaders{t, call.root};
    const int host = t.host_of[static_cast<std::size_t>(r)];
    const int leader = leaders.of(host);
    if (!started_) {
      started_ = true;
      if (r == leader)  // Step 1
        start(step1_, ctx, leaders.all(), leaders.root_host,
              r == call.root ? call.input : call.output, 1);
      // Step 2
      const auto& locals = t.ranks_on[static_cast<std::size_t>(host)];
      int leader_index = 0;
      while (locals[static_cast<std::size_t>(leader_index)] != leader) ++leader_index;
      start(step2_, ctx, locals, leader_index, r == call.root ? call.input : call.output, 2);
    }
    if (step1_.alg && !step1_.done) {
      if (!step1_.alg->progress(*step1_.ctx)) return false;
      step1_.done = true;
    }
    if (!step2_.done) {
      if (!step2_.alg->progress(*step2_.ctx)) return false;
      step2_.done = true;
    }
    return true;
  }

 private:
  struct stage {
    collective_call call;
    std::unique_ptr<sub_context> ctx;
    std::unique_ptr<algorithm> alg;
    bool done = false;
  };

  /// `s` runs a binomial broadcast among `members` from members[root], `in`
  /// being what the root sends, its steps from span `index` on.
  static void start(stage& s, op_context& whole, std::vector<int> members, int root,
                    const tensor& in, std::uint32_t index) {
    s.call.code = op_code::broadcast;
    s.call.name = whole.call().name;
    s.call.root = root;
    s.call.input = in;
    s.call.output = whole.call().output;
    s.call.timeout = whole.call().timeout;
    s.ctx = std::make_unique<sub_context>(whole, std::move(members), s.call,
                                          index * sub_context::step_span);
    s.alg = make_broadcast_binomial();
  }

  bool started_ = false;
  stage step1_, step2_;
};

}  // namespace

std::unique_ptr<algorithm> make_broadcast_hier() {
  return std::make_unique<broadcast_hier>();
}

}  // namespace troupe::detail
