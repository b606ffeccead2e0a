// Helpers shared by the algorithm files: chunking, payload checks and the
// reduction steps every reducing algorithm performs.

#include <numeric>

#include "algorithms/algorithm.hpp"

#include <algorithm>
#include "kernels/reduce_kernels.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

op_context::op_context(int rank, int size, collective_call& call)
    : rank_(rank),
      size_(size),
      call_(call),
      agree_(call, rank, size),
      gated_(call.code != op_code::monitored_barrier) {}

ring_order::ring_order(const group_topology& t, int size) : size_(size) {
  if (t.size() != size || t.hosts() <= 1) return;
  at_ = t.host_order();
  pos_.assign(static_cast<std::size_t>(size), 0);
  for (int p = 0; p < size; ++p)
    pos_[static_cast<std::size_t>(at_[static_cast<std::size_t>(p)])] = p;
  for (int p = 0; p < size; ++p) identity_ = identity_ && at_[static_cast<std::size_t>(p)] == p;
}

void op_context::set_topology(std::shared_ptr<const group_topology> t) {
  topology_ = std::move(t);
  bool changed = false;
  if (call_.code == op_code::alltoallv && call_.even_splits && !call_.bruck_alltoall) {
    call_.bruck_alltoall = alltoall_runs_bruck(call_, topology(), size_);
    changed = call_.bruck_alltoall;
  }
  if (const auto kind = call_algorithm(call_, topology(), size_); kind != algorithm_kind::other) {
    const auto said = static_cast<std::uint8_t>(static_cast<int>(kind) + 1);
    changed = changed || call_.algorithm != said;
    call_.algorithm = said;
  }
  // Nothing was sent or heard yet: this rank's fingerprint says it now.
  if (changed) agree_ = agreement(call_, rank_, size_);
  ride_agreement_on_data();
}

const group_topology& op_context::topology() const noexcept {
  static const group_topology unknown;  // no hosts known: one host
  return topology_ ? *topology_ : unknown;
}

void op_context::deliver(int peer, std::uint32_t step, tensor payload, const fingerprint_ptr& fp) {
  if (fp) agree_.heard(peer, fp);
  if (step == alarm_step) alarmed_ = true;
  if (step == describe_step || step == alarm_step) return;
  if (!agree_.heard_from(peer)) {
    // The first message of every call to each peer says what it called.
    if (gated_)
      throw error(errc::internal, "rank " + std::to_string(peer) + " sent step " +
                                      std::to_string(step) + " before describing its call");
    return;
  }
  if (!agree_.agrees_with(peer)) return;  // its call differs: settled() says how
  inbox_.insert_or_assign({step, peer}, std::move(payload));
}

void op_context::ride_agreement_on_data() {
  // An alltoall's split sizes agree pairwise, not transitively: a chain of
  // agreeing pairs says nothing about two other ranks. Its data goes
  // between every two ranks anyway, and the fingerprints with it. Even
  // splits on Bruck's steps are one fingerprint for all: they ride.
  rides_ = gated_ && (call_.code != op_code::alltoallv || call_.bruck_alltoall) &&
           agreement_rides_data(size_, topology().messages_leave_process());
  if (!rides_ || result_needs_every_rank(call_)) return;
  while ((1LL << rounds_) < size_) ++rounds_;
}

void op_context::describe_to_rest() {
  if (!gated_ || rides_) return;
  for (int p : agree_.untold()) transmit(p, describe_step, tensor{}, agree_.mine());
}

void op_context::tell_successor() {
  // With rounds of dissemination, the first goes to the successor (settled()).
  if (!owes_successor()) return;
  if (const int next = (rank_ + 1) % size_; agree_.tell(next))
    transmit(next, describe_step, tensor{}, agree_.mine());
}

bool op_context::settled() {
  if (!gated_) {
    if (agree_.differs()) throw disagreement_error(agree_.disagreement(true));
    return true;
  }
  if (rides_ && !full_) {
    // Riding the data: a rank whose algorithm finished heard every rank
    // through agreeing messages. A disagreement found here or alarmed by a
    // peer: every peer is alarmed, with this rank's fingerprint, so that all
    // switch to the full exchange and fail with one text.
    if (!agree_.differs() && !alarmed_) {
      // Dissemination: round k goes to rank + 2^k once round k - 1 came
      // from rank - 2^(k-1), checked as every message is (deliver()).
      while (round_ < rounds_) {
        const auto step = agreement_round_step + static_cast<std::uint32_t>(round_);
        const auto hop = static_cast<int>((1LL << round_) % size_);
        if (!round_sent_) {
          send((rank_ + hop) % size_, step, tensor{});
          round_sent_ = true;
        }
        const int from = (rank_ - hop + size_) % size_;
        auto i = inbox_.find({step, from});
        if (i == inbox_.end()) {
          blocked_peer_ = from;
          blocked_step_ = step;
          return false;
        }
        inbox_.erase(i);
        ++round_;
        round_sent_ = false;
      }
      return true;
    }
    full_ = true;
    agree_.told_all();
    for (int p = 0; p < size_; ++p)
      if (p != rank_) transmit(p, alarm_step, tensor{}, agree_.mine());
  }
  if (const int p = agree_.missing(); p >= 0) {
    blocked_peer_ = p;
    blocked_step_ = describe_step;
    return false;
  }
  if (auto why = agree_.disagreement(); !why.empty()) throw disagreement_error(why);
  return true;
}

std::optional<tensor> op_context::take(int peer, std::uint32_t step) {
  auto i = inbox_.find({step, peer});
  if (i == inbox_.end()) {
    blocked_peer_ = peer;
    blocked_step_ = step;
    return std::nullopt;
  }
  auto t = std::move(i->second);
  inbox_.erase(i);
  return t;
}

std::string op_context::describe_peer(int peer) const {
  return "rank " + std::to_string(peer);
}

std::string op_context::waiting_for() const {
  if (blocked_peer_ < 0) return "no message";
  const auto who = describe_peer(blocked_peer_);
  if (blocked_step_ == describe_step) return who + " to join the call";
  if (blocked_step_ >= agreement_round_step && blocked_step_ < alarm_step)
    return who + " (agreement round " + std::to_string(blocked_step_ - agreement_round_step) + ")";
  return who + " (step " + std::to_string(blocked_step_) + ")";
}

std::string op_context::blocked_on() const {
  const std::string nothing = "nothing of this sequence number arrived from it";
  if (blocked_peer_ >= 0 && !agree_.heard_from(blocked_peer_))
    // Riding the data, a peer that joined tells only some ranks at once.
    return "join this " + std::string(call_.name) +
           (awaits_everyone() ? " (" + nothing + ")"
                              : " or send its data (" + nothing + "; " + waiting_for() + ")");
  return "send its data (" + waiting_for() + ")";
}

std::string algorithm::on_timeout(op_context& ctx) {
  if (!ctx.awaits_everyone()) {
    // Riding the data, a peer that joined tells only some ranks at once:
    // name the one this rank waits for, and whether it was heard at all.
    const int p = ctx.blocked_peer();
    if (p >= 0 && !ctx.agreed().heard_from(p))
      return "waiting for " + ctx.describe_peer(p) + " to " + ctx.blocked_on();
    return "waiting for " + ctx.waiting_for();
  }
  // A rank that never came is the one to name, not the neighbour that waits for it.
  // One rank is named as the transport knows it (its host and process).
  if (auto missing = ctx.agreed().missing_ranks(); !missing.empty()) {
    const bool one = missing.find(',') == std::string::npos;
    return "waiting for " + (one ? ctx.describe_peer(ctx.agreed().missing()) : missing) +
           " to join this " + ctx.call().name + " (nothing of this sequence number arrived from " +
           (one ? "it" : "them") + ")";
  }
  return "waiting for " + ctx.waiting_for();
}

std::pair<std::int64_t, std::int64_t> chunk_range(std::int64_t n, int parts, int i) {
  auto base = n / parts;
  auto extra = n % parts;
  auto offset = i * base + std::min<std::int64_t>(i, extra);
  return {offset, base + (i < extra ? 1 : 0)};
}

std::vector<std::int64_t> offsets_of(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> r(counts.size(), 0);
  std::exclusive_scan(counts.begin(), counts.end(), r.begin(), std::int64_t{0});
  return r;
}

void check_payload(const collective_call& call, const tensor& payload, std::int64_t count, int peer,
                   std::uint32_t step) {
  auto expected = static_cast<std::size_t>(count) * element_size(call.input.scalar_type());
  if (payload.nbytes() != expected || payload.scalar_type() != call.input.scalar_type())
    throw error(errc::invalid_argument,
                std::string(call.name) + ": rank " + std::to_string(peer) + " sent " +
                    std::to_string(payload.nbytes()) + " bytes of " +
                    std::string(to_string(payload.scalar_type())) + " at step " +
                    std::to_string(step) + ", this rank expected " + std::to_string(expected) +
                    " bytes of " + std::string(to_string(call.input.scalar_type())) +
                    " (do the ranks pass tensors of the same size and dtype?)");
}

tensor fresh_copy(const tensor& src) {
  return src.clone();
}

void place(const collective_call& call, const tensor& payload, tensor out, int peer,
           std::uint32_t step) {
  check_payload(call, payload, out.numel(), peer, step);
  if (payload.data() != out.data()) out.copy_from(payload);  // else received in place
}

op_context::arrival_fn place_on_arrival(const collective_call& call, tensor out, int peer,
                                        std::uint32_t step) {
  return [&call, out = std::move(out), peer, step](const tensor& in) {
    place(call, in, out, peer, step);
  };
}

block_slices::block_slices(const std::vector<std::int64_t>& counts, int k, int s)
    : counts_(counts), offsets_(offsets_of(counts)), k_(k), s_(s) {}

tensor block_slices::of(const tensor& buffer, int b, bool alone) const {
  const auto [off, len] = chunk_range(counts_[static_cast<std::size_t>(b)], k_, s_);
  return buffer.flat_slice((alone ? 0 : offsets_[static_cast<std::size_t>(b)]) + off, len);
}

std::vector<std::int64_t> host_totals(const group_topology& t,
                                      const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> totals;
  for (const auto& on : t.ranks_on) {
    std::int64_t total = 0;
    for (int b : on) total += counts[static_cast<std::size_t>(b)];
    totals.push_back(total);
  }
  return totals;
}

void reorder_by_host(const group_topology& t, const std::vector<std::int64_t>& counts,
                     const tensor& ranks, const tensor& hosts, bool to_hosts) {
  const auto offsets = offsets_of(counts);
  std::int64_t at = 0;
  for (const auto& on : t.ranks_on)
    for (int b : on) {
      const auto n = counts[static_cast<std::size_t>(b)];
      auto in_ranks = ranks.flat_slice(offsets[static_cast<std::size_t>(b)], n);
      auto in_hosts = hosts.flat_slice(at, n);
      (to_hosts ? in_hosts : in_ranks).copy_from(to_hosts ? in_ranks : in_hosts);
      at += n;
    }
}

bool follow_leader(op_context& ctx, int leader, std::uint32_t to, std::uint32_t from,
                   const std::function<tensor()>& mine, bool& started) {
  auto& call = ctx.call();
  if (!started) {
    started = true;
    ctx.send(leader, to, to_send(ctx, leader, mine()));
    receive_into(ctx, call, leader, from, call.output);
  }
  auto in = ctx.take(leader, from);
  if (!in) return false;
  if (in->defined()) place(call, *in, call.output, leader, from);
  return true;
}

bool overlaps(const tensor& a, const tensor& b) {
  if (!a.defined() || !b.defined() || a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* a0 = static_cast<const std::byte*>(a.data());
  const auto* b0 = static_cast<const std::byte*>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

void receive_into(op_context& ctx, const collective_call& call, int peer, std::uint32_t step,
                  const tensor& out) {
  ctx.post_receive(peer, step, out);
  ctx.consume_on_arrival(peer, step, place_on_arrival(call, out, peer, step));
}

tensor to_send(const op_context& ctx, int peer, const tensor& t) {
  return ctx.copies_on_send(peer) ? t : fresh_copy(t);
}

int segments_of(std::int64_t elements, dtype t, std::size_t segment_bytes) {
  const auto per =
      static_cast<std::int64_t>(std::max<std::size_t>(1, segment_bytes / element_size(t)));
  return static_cast<int>(std::max<std::int64_t>(1, (elements + per - 1) / per));
}

tensor combine(const reduce_op& op, const tensor& a, const tensor& b) {
  auto r = tensor::empty({a.numel()}, a.scalar_type());
  const void* srcs[] = {a.data(), b.data()};
  reduce_many(a.scalar_type(), op.op(), r.data(), srcs, 2, static_cast<std::size_t>(a.numel()));
  return r;
}

tensor combine_received(const op_context& ctx, int peer, const reduce_op& op, const tensor& a,
                        const tensor& b) {
  if (!ctx.owns_received(peer) || !b.is_contiguous() || overlaps(a, b)) return combine(op, a, b);
  // Operands in combine's order: the kernel accumulates a chunk at a time
  // on its stack before writing it over b.
  const void* srcs[] = {a.data(), b.data()};
  reduce_many(a.scalar_type(), op.op(), b.data(), srcs, 2, static_cast<std::size_t>(a.numel()));
  return b;
}

tensor own_contribution(const collective_call& call, const tensor& input) {
  if (call.op.op() != reduce_op::PREMUL_SUM) return input;
  auto r = input.clone();
  scale_by(r.scalar_type(), r.data(), static_cast<std::size_t>(r.numel()), call.op.scale());
  return r;
}

bool reduce_in_order(op_context& ctx, const std::vector<int>& from, std::uint32_t step,
                     std::int64_t count, const reduce_op& op, std::vector<tensor>& parts,
                     tensor& out) {
  const auto& call = ctx.call();
  for (std::size_t q = 0; q < from.size(); ++q) {
    if (parts[q].defined()) continue;
    auto in = ctx.take(from[q], step);
    if (!in) return false;
    check_payload(call, *in, count, from[q], step);
    parts[q] = *in;
  }
  std::vector<const void*> srcs;
  for (auto& p : parts) srcs.push_back(p.data());
  if (!out.defined()) out = tensor::empty({count}, call.input.scalar_type());
  reduce_many(out.scalar_type(), op.op(), out.data(), srcs.data(), srcs.size(),
              static_cast<std::size_t>(count));
  parts.clear();
  return true;
}

reduce_op partial_op(const reduce_op& op) {
  return op.op() == reduce_op::AVG || op.op() == reduce_op::PREMUL_SUM ? reduce_op{reduce_op::SUM}
                                                                       : op;
}

void finish_reduction(const collective_call& call, tensor& data, int size) {
  if (call.op.op() != reduce_op::AVG) return;
  divide_by(data.scalar_type(), data.data(), static_cast<std::size_t>(data.numel()),
            static_cast<double>(size) * static_cast<double>(call.avg_local));
}

}  // namespace troupe::detail
