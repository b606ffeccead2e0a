#include "inline/algorithm_op.hpp"

#include <algorithm>
#include <tuple>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "base/sim_conductor.hpp"
#include "base/wait_chain.hpp"
#include "inline/engine.hpp"
#include "inline/medium.hpp"
#include "inline/message_medium.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {
namespace {

/// How long a call riding the data waits before it tells its fingerprint
/// to its ring successor (op_context::tell_successor): only calls that
/// differ need it, and a call that agreed ends sooner. Sent with every
/// call, it cost ranks sharing CPUs a wake-up each (emulated hosts, 4 B:
/// 2 x 2 at 2 ranks per CPU allreduce 96-128 us with it, 85-102 without,
/// allgather 105-152 and 71-107; 4 x 2 at 4 ranks per CPU allgather
/// 592-784 and 416-625). A disagreement is found this much later; waits
/// sleep at most 2 ms between looks (inline/engine.cpp, max_sleep).
constexpr auto successor_delay = std::chrono::milliseconds{2};

/// What the algorithm sees: sends go out at once, messages come from the inbox.
class message_context final : public op_context {
 public:
  message_context(message_medium& net, inline_engine& engine, std::uint64_t op,
                  collective_call& call, inline_clock::time_point deadline,
                  std::chrono::milliseconds timeout, reading reads)
      : op_context(net.rank(), net.size(), call),
        net_(net),
        engine_(engine),
        op_(op),
        deadline_(deadline),
        timeout_(timeout),
        reads_(net.reads_while_waiting(reads)),
        stall_{tell_early_after(timeout), [this] {
                 engine_.tell_wait_early(this->call().seq, timeout_, writing_to_,
                                         take_what_it_was_sent);
               }} {}
  void transmit(int peer, std::uint32_t step, tensor payload, fingerprint_ptr fp) override {
    if (step >= agreement_round_step)  // describe, alarm and dissemination rounds
      if (auto* c = inline_counting()) c->described.fetch_add(1, std::memory_order_relaxed);
    // A write the peer takes nothing of for half the timeout tells so first.
    writing_to_ = peer;
    if (auto why = net_.send(peer, op_, step, static_cast<std::uint8_t>(call().code), payload,
                             deadline_, reads_, fp, &stall_);
        !why.empty())
      throw peer_given_up(peer, why);
  }
  // Frames to other processes are written out at once; ranks in this
  // process get the tensor itself.
  bool copies_on_send(int peer) const override { return !net_.is_local(peer); }
  bool paced(int peer) const override {
    const bool paced = net_.paced(peer);
    if (auto* c = paced ? inline_counting() : nullptr)
      c->paced.fetch_add(1, std::memory_order_relaxed);
    return paced;
  }
  // Only where a reader thread receives while this one sends.
  bool consume_on_arrival(int peer, std::uint32_t step, arrival_fn fn) override {
    if (net_.is_local(peer) || net_.reads_from(peer, reads_)) return false;
    return net_.on_arrival(op_, step, peer, static_cast<std::uint8_t>(call().code), std::move(fn));
  }
  void post_receive(int peer, std::uint32_t step, const tensor& out) override {
    net_.post_receive(op_, step, peer, static_cast<std::uint8_t>(call().code), out);
  }

 private:
  message_medium& net_;
  inline_engine& engine_;
  std::uint64_t op_;
  inline_clock::time_point deadline_;
  std::chrono::milliseconds timeout_;
  reading reads_;
  int writing_to_ = -1;  // the peer transmit writes to (stall_ tells it)
  write_stall stall_;
};

class algorithm_op final : public inline_op {
 public:
  explicit algorithm_op(call_ptr call) : call_(std::move(call)) {}

  bool step(inline_context& fc, bool& moved) override {
    auto& net = static_cast<message_medium&>(fc.med);
    if (!ctx_) {
      call_->seq = seq;
      ctx_ =
          std::make_unique<message_context>(net, fc.engine, op, *call_, deadline, timeout, reads);
      ctx_->set_topology(net.topology());
      alg_ = make_algorithm(*call_, fc.rank, ctx_->topology(), fc.size);
      moved = true;
      // Send first: a peer must get this rank's fingerprint (with its
      // first message, or alone) to tell whether the calls agree.
      finished_ = alg_->progress(*ctx_);
      ctx_->describe_to_rest();
      // Only a call riding the data has a successor to tell (and reads the
      // clock for it); a simulation's schedule may not depend on the wall
      // clock.
      told_successor_ = !ctx_->owes_successor();
      if (!told_successor_ && in_simulation()) tell_successor();
    } else {
      std::vector<std::tuple<int, std::uint32_t, message_medium::message>> got;
      net.take_all(op, [&](int src, std::uint32_t step, message_medium::message& m) {
        if (src < 0 || src >= fc.size || src == fc.rank) return;
        got.emplace_back(src, step, std::move(m));
      });
      // What each sender called first (its first message says so), then
      // the data of the senders that agree.
      for (auto& [src, step, m] : got)
        if (m.fp) ctx_->heard(src, m.fp);
      for (auto& [src, step, m] : got) {
        if (m.error && ctx_->agreed().agrees_with(src)) std::rethrow_exception(m.error);
        ctx_->deliver(src, step, std::move(m.payload));
        moved = true;
      }
      if (!finished_ && !ctx_->disagrees()) finished_ = alg_->progress(*ctx_);
      if (!told_successor_ && inline_clock::now() - (deadline - timeout) >= successor_delay) {
        tell_successor();
        moved = true;
      }
    }
    if (!ctx_->settled()) {  // throws when the ranks' calls differ
      // A peer that issued this sequence number on another engine never comes.
      const int p = ctx_->agreed().missing();
      const int mine = announcement(static_cast<std::uint8_t>(call_->code), route::messages);
      if (const int theirs = p >= 0 ? fc.announcer.announced(p, seq) : -1;
          theirs >= 0 && (theirs >> 4) != (mine >> 4))
        throw error(errc::mismatch, announced_mismatch(p, theirs, mine, name));
      return false;
    }
    return finished_ && finish();
  }

  bool finish() {
    if (call_->on_success) call_->on_success();
    return true;
  }

  void tell_successor() {
    ctx_->tell_successor();
    told_successor_ = true;
  }

  int blocked_rank() const override { return ctx_ ? ctx_->blocked_peer() : -1; }
  std::pair<int, std::string> blocker() const override {
    if (!ctx_) return {-1, "start"};
    return {ctx_->blocked_peer(), ctx_->blocked_on()};
  }

  std::string disagreement() const override {
    return ctx_ && ctx_->disagrees() ? ctx_->agreed().disagreement(true) : std::string{};
  }

 private:
  call_ptr call_;  // the caller's, not copied (the op is its last user)
  std::unique_ptr<message_context> ctx_;
  std::unique_ptr<algorithm> alg_;
  bool finished_ = false;  // the algorithm is done (the agreement may still wait)
  bool told_successor_ = false;
};

}  // namespace

std::unique_ptr<inline_op> make_algorithm_op(call_ptr call) {
  // Up to 1 MiB latency counts: the waiting thread reads its peers' sockets
  // too; beyond, only their rings (the reader threads take the sockets).
  const auto bytes = std::max(call->input.defined() ? call->input.nbytes() : 0,
                              call->output.defined() ? call->output.nbytes() : 0);
  auto op = std::make_unique<algorithm_op>(std::move(call));
  op->reads = bytes <= (std::size_t{1} << 20) ? reading::all : reading::host;
  return op;
}

}  // namespace troupe::detail
