#pragma once
// sub_context — an algorithm run on some of the group's ranks, as a part of
// another algorithm: a hierarchical allreduce runs an allreduce among the
// ranks of a host, then among one rank of each host. The part sees its own
// ranks 0..k-1 and its own steps; its messages go through the whole call's
// context as messages of the mapped rank, at steps offset by the part's
// base, so parts never mix (bases are multiples of step_span).

#include <memory>
#include <utility>
#include <vector>

#include "algorithms/algorithm.hpp"

namespace troupe::detail {

class sub_context final : public op_context {
 public:
  /// Steps one part may use.
  static constexpr std::uint32_t step_span = 1u << 24;

  /// The part of `whole` among `members` (group ranks, this rank among
  /// them) running `call`, its steps from `base` on.
  sub_context(op_context& whole, std::vector<int> members, collective_call& call,
              std::uint32_t base)
      : op_context(index_of(members, whole.rank()), static_cast<int>(members.size()), call),
        whole_(whole),
        members_(std::move(members)),
        base_(base) {}

  bool copies_on_send(int peer) const override { return whole_.copies_on_send(member(peer)); }
  bool paced(int peer) const override { return whole_.paced(member(peer)); }
  std::optional<tensor> take(int peer, std::uint32_t step) override {
    return whole_.take(member(peer), base_ + step);
  }
  bool consume_on_arrival(int peer, std::uint32_t step, arrival_fn fn) override {
    return whole_.consume_on_arrival(member(peer), base_ + step, std::move(fn));
  }
  void post_receive(int peer, std::uint32_t step, const tensor& out) override {
    whole_.post_receive(member(peer), base_ + step, out);
  }
  std::string describe_peer(int peer) const override { return whole_.describe_peer(member(peer)); }

 protected:
  /// The whole call's context says what it called with its first message.
  void transmit(int peer, std::uint32_t step, tensor payload, fingerprint_ptr) override {
    whole_.send(member(peer), base_ + step, std::move(payload));
  }

 private:
  static int index_of(const std::vector<int>& members, int rank) {
    for (std::size_t i = 0; i < members.size(); ++i)
      if (members[i] == rank) return static_cast<int>(i);
    return -1;
  }
  int member(int i) const { return members_[static_cast<std::size_t>(i)]; }

  op_context& whole_;
  std::vector<int> members_;
  std::uint32_t base_;
};

}  // namespace troupe::detail
