// The group actor's timeouts (actors/group_actor.cpp): one timer message
// at a time (on_tick) names the members found crashed once their grace
// passed, tells the wait of a call that took nothing for half its timeout
// (base/wait_chain.hpp), and fails the calls and receives past their
// deadline, naming whom they waited for and where that chain of waits starts.

#include <algorithm>

#include "actors/group_actor_state.hpp"
#include "base/sim_conductor.hpp"
#include "base/texts.hpp"
#include "troupe/error.hpp"

namespace troupe::detail::group_actor_parts {

/// Makes sure a timeout message arrives no later than `deadline`. One timer is
/// pending at a time (not one per call), since calls share their timeout.
void schedule_tick(self_ptr self, clock::time_point deadline) {
  auto& st = self->state;
  if (st.next_tick && *st.next_tick <= deadline) return;
  st.next_tick = deadline;
  auto delay = std::chrono::duration_cast<std::chrono::microseconds>(deadline - clock::now());
  self->delayed_send(self, std::max(delay, std::chrono::microseconds{0}), timeout_atom::value);
}

/// Fails call `seq` at its timeout, `waited` ("waiting for rank 1 (...) to
/// ..."), as the inline engine words it: "Timed out after 300 ms waiting
/// for ...". Where `peer` (>= 0) is the rank waited for (to `what`), the
/// chain of waits is followed to where the wait starts (base/wait_chain.hpp).
void fail_timed_out(self_ptr self, std::uint64_t seq, std::string waited, int peer,
                    const std::string& what) {
  auto& st = self->state;
  const auto& op = st.ops.at(seq);
  if (st.info.waits && peer >= 0 && !in_simulation()) {
    auto name = [&st](int r) { return st.net->describe_peer(r); };
    waited =
        blame(waited,
              wait_chain(st.info.waits, seq, st.info.rank, st.info.size, peer, what, name,
                         std::chrono::duration_cast<std::chrono::milliseconds>(op.call->timeout)),
              name);
  }
  fail_op(self, seq, errc::timeout,
          timeout_after(op.call->timeout) + (waited.rfind("waiting for", 0) == 0 ? " " : ": ") +
              waited);
}

/// Whom call `op` waits for, and for what, as its timeout names it: a rank
/// that never came, else the one its algorithm waits for (-1: none known).
std::pair<int, std::string> waited_for(const group_state& st, const running_op& op) {
  const bool missing = op.ctx->awaits_everyone() && !op.ctx->agreed().missing_ranks().empty();
  const int peer = missing ? op.ctx->agreed().missing() : op.ctx->blocked_peer();
  return {peer < st.info.size ? peer : -1,
          missing ? "join this " + std::string(op.call->name) + " (nothing of it arrived from it)"
                  : op.ctx->blocked_on()};
}

/// When on_tick next looks at call `op`: once it took nothing for half its
/// timeout, to tell its wait early (base/wait_chain.hpp), then at its
/// deadline.
clock::time_point told_early_at(const running_op& op) {
  return op.told_early ? op.deadline
                       : std::min(op.deadline, op.progressed + tell_early_after(op.call->timeout));
}

/// Names the members found crashed once crash_grace passed (failing every
/// call), tells the waits of calls at half their timeout, fails every call
/// past its deadline, then schedules the next check.
void on_tick(self_ptr self) {
  auto& st = self->state;
  const auto now = clock::now();
  if (st.next_tick && *st.next_tick <= now) st.next_tick.reset();
  if (st.crash_due && *st.crash_due <= now && !st.aborted) {
    fail_everything(self, errc::peer_failure, st.crashed);
    return;
  }
  std::vector<std::uint64_t> expired;
  for (auto& [seq, op] : st.ops) {
    if (op.deadline <= now) {
      expired.push_back(seq);
    } else if (!op.told_early && told_early_at(op) <= now) {
      // It took nothing for half its timeout: one that still takes tells
      // nothing early (whom it waits for at a moment is not what holds it up).
      op.told_early = true;
      const auto [peer, what] = waited_for(st, op);
      if (st.info.waits && peer >= 0 && !in_simulation())
        tell_wait_early(st.info.waits, seq, st.info.rank, peer, what, op.call->timeout);
    }
  }
  for (auto seq : expired) {
    auto& op = st.ops[seq];
    // A peer whose call differs, while another never said what it called.
    if (op.ctx->disagrees()) {
      fail_op(self, seq, errc::mismatch, mismatch_text(op.ctx->agreed().disagreement(true)));
      continue;
    }
    // Where the wait starts, when the rank waited for was itself waiting.
    // A rank that never came is the one named (on_timeout); this rank's
    // wait for it is still told, for the ranks whose waits lead here.
    const auto [peer, what] = waited_for(st, op);
    fail_timed_out(self, seq, op.alg->on_timeout(*op.ctx), peer, what);
  }
  for (auto i = st.recvs.begin(); i != st.recvs.end();) {
    if (i->second.deadline > now) {
      ++i;
      continue;
    }
    auto r = std::move(i->second);
    i = st.recvs.erase(i);
    const auto& c = *r.call;
    auto from =
        c.kind == p2p_call::recv_any ? std::string("any rank") : st.net->describe_peer(c.peer);
    r.rp.deliver(make_troupe_error(static_cast<int>(errc::timeout),
                                   where(st, c.name, 0) + " failed: " + timeout_after(c.timeout) +
                                       " waiting for a message from " + from + " with tag " +
                                       std::to_string(c.tag)));
  }
  std::optional<clock::time_point> next;
  for (auto& kv : st.ops)
    next = next ? std::min(*next, told_early_at(kv.second)) : told_early_at(kv.second);
  for (auto& kv : st.recvs) next = next ? std::min(*next, kv.second.deadline) : kv.second.deadline;
  if (st.crash_due) next = next ? std::min(*next, *st.crash_due) : *st.crash_due;
  if (next) schedule_tick(self, *next);
}

}  // namespace troupe::detail::group_actor_parts
