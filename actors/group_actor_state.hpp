#pragma once
// What the group actor (actors/group_actor.cpp) keeps of one (group, rank):
// its running collectives, early messages and pending receives, and the
// helpers its message handlers and its timeouts (group_actor_timeouts.cpp)
// share. Internal to those two files.

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/actor_peers.hpp"
#include "actors/group_actor.hpp"
#include "algorithms/algorithm.hpp"
#include "base/gone_peers.hpp"
#include "base/wait_chain.hpp"

namespace troupe::detail::group_actor_parts {

/// The op_context of a running collective: sends go through the transport.
class actor_op_context final : public op_context {
 public:
  /// `waits`: where it tells a write that its peer took nothing of for
  /// half the timeout (null: nowhere).
  actor_op_context(int rank, int size, collective_call& call, std::uint64_t seq, actor_peers& net,
                   std::chrono::steady_clock::time_point deadline, std::shared_ptr<store> waits)
      : op_context(rank, size, call),
        seq_(seq),
        net_(net),
        deadline_(deadline),
        waits_(std::move(waits)),
        stall_{tell_early_after(call.timeout), [this] {
                 tell_wait_early(waits_, seq_, this->rank(), writing_to_, take_what_it_was_sent,
                                 this->call().timeout);
               }} {}
  void transmit(int peer, std::uint32_t step, tensor payload, fingerprint_ptr fp) override {
    writing_to_ = peer;
    if (auto why = net_.send(
            peer, envelope{seq_, step, rank(), call().code, std::move(payload), std::move(fp)},
            deadline_, waits_ ? &stall_ : nullptr);
        !why.empty())
      throw peer_given_up(peer, why);
  }
  bool copies_on_send(int peer) const override { return !net_.reads_after_send(peer); }
  std::string describe_peer(int peer) const override { return net_.describe_peer(peer); }

 private:
  std::uint64_t seq_;
  actor_peers& net_;
  std::chrono::steady_clock::time_point deadline_;
  std::shared_ptr<store> waits_;
  int writing_to_ = -1;  // the peer transmit writes to (stall_ tells it)
  write_stall stall_;
};

using clock = std::chrono::steady_clock;

struct running_op {
  clock::time_point deadline;
  call_ptr call;
  std::unique_ptr<algorithm> alg;
  std::unique_ptr<actor_op_context> ctx;
  caf::typed_response_promise<tensor_list> rp;
  bool described = false;        // this rank's fingerprint went to every peer
  bool finished = false;         // the algorithm is done (the agreement may still wait)
  bool told_early = false;       // its wait was told (on_tick, told_early_at)
  clock::time_point progressed;  // its issue, or the last message it took
};

struct pending_recv {
  clock::time_point deadline;
  p2p_ptr call;
  caf::typed_response_promise<tensor_list> rp;
};

struct group_state {
  group_info info;
  std::shared_ptr<actor_peers> net;
  std::uint64_t issued = 0;  // collectives issued; the last one has seq == issued
  std::map<std::uint64_t, running_op> ops;
  std::map<std::uint64_t, std::vector<envelope>> early;  // data for calls not made yet
  struct early_account {
    std::size_t messages = 0;
    std::uint64_t bytes = 0, next_bytes = 0;  // all early payloads, those of seq issued + 1
  };
  std::vector<early_account> early_from;        // by sender (bounds: transport/frame.hpp)
  std::vector<early_account> unmatched_from;    // the same for unmatched p2p messages
  std::deque<p2p_envelope> unmatched;           // p2p messages nobody asked for yet
  std::map<std::uint64_t, pending_recv> recvs;  // by post order
  std::uint64_t next_recv = 0;
  std::optional<std::pair<errc, std::string>> aborted;
  std::optional<clock::time_point> next_tick;  // when the pending timeout message fires
  std::string crashed;                         // members found crashed, not yet named
  std::optional<clock::time_point> crash_due;  // when they are (crash_grace)
  gone_peers gone;                             // members that left, and how
  bool ranks_sorted = false;  // info.global_ranks ascending: a binary search finds a world rank
  std::vector<std::function<void()>> before_peers;  // see until_peers
  std::shared_ptr<const group_topology> topology;   // the calls' algorithms see it
  static inline const char* name = "troupe.group";
};

using self_ptr = group_actor::stateful_pointer<group_state>;

/// "op on group 'g' (rank r, seq s)": where a call's error says it failed.
std::string where(const group_state& st, const std::string& op, std::uint64_t seq);
/// "rank 3 (...) left group 'g' (why)": the error of a call that needs a
/// peer that left.
std::string left_text(const group_state& st, int peer, const std::string& why);
/// Fails call `seq` with `code`: "<where> failed: <cause>".
void fail_op(self_ptr self, std::uint64_t seq, errc code, const std::string& cause);
/// Fails every call and receive, and every later one (an abort, a crash).
void fail_everything(self_ptr self, errc code, const std::string& reason);

// Timeouts (group_actor_timeouts.cpp).

/// Makes sure a timeout message arrives no later than `deadline`.
void schedule_tick(self_ptr self, clock::time_point deadline);
/// Fails call `seq` at its timeout, following the chain of waits from `peer`.
void fail_timed_out(self_ptr self, std::uint64_t seq, std::string waited, int peer,
                    const std::string& what);
/// When on_tick next looks at call `op` (half its timeout, then its deadline).
clock::time_point told_early_at(const running_op& op);
/// The timeout message: names crashed members, tells waits, fails late calls.
void on_tick(self_ptr self);

}  // namespace troupe::detail::group_actor_parts
