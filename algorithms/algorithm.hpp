#pragma once
// The interface between a collective algorithm and the engine that runs it.
//
// An algorithm is a resumable state machine over one collective_call, a
// message protocol between the group's ranks. Two engines run the same
// algorithms: the inline engine's algorithm_op (inline/algorithm_op.cpp, in
// the thread that waits for the call; the default for CPU tensors between
// hosts and for what the shared segment does not run) and the group actor
// (actors/group_actor.cpp; monitored_barrier, TROUPE_ENGINE=actors). The engine
// calls progress() when the call starts and again whenever a message for it
// arrives; progress() advances through as many steps as the messages at hand
// allow and returns true when the algorithm finished. It sends with
// ctx.send() and takes messages with ctx.take(); it never names a transport
// or an engine. Errors are thrown as troupe::error and fail the call.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/cost_model.hpp"
#include "algorithms/topology.hpp"
#include "base/agreement.hpp"
#include "base/call.hpp"

namespace troupe::detail {

/// What an algorithm sees of its group actor (or of the inline operation
/// that runs it). It also keeps the call's agreement (base/agreement.hpp):
/// the first message to each peer carries this rank's fingerprint, and
/// messages of a peer whose call differs never reach the algorithm.
class op_context {
 public:
  op_context(int rank, int size, collective_call& call);
  virtual ~op_context() = default;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  collective_call& call() noexcept { return call_; }
  /// Where the group's ranks live, as the engine says (none said: one host,
  /// an empty topology).
  const group_topology& topology() const noexcept;
  /// Says where the ranks live (before the first progress). An alltoall of
  /// even splits then learns whether it runs Bruck's steps
  /// (alltoall_runs_bruck), which its fingerprint says, and the agreement
  /// whether it rides with the data (ride_agreement_on_data).
  void set_topology(std::shared_ptr<const group_topology> t);

  /// Sends `payload` to group rank `peer` as step `step` of this call. The
  /// payload is shared, so it must never be written to afterwards.
  void send(int peer, std::uint32_t step, tensor payload) {
    transmit(peer, step, std::move(payload), agree_.tell(peer) ? agree_.mine() : nullptr);
  }
  /// Whether send() to `peer` has copied the payload's bytes when it returns
  /// (then a slice of the caller's memory may be sent as is).
  virtual bool copies_on_send(int /*peer*/) const { return false; }
  /// Whether a large transfer to `peer` should go in small segments, a few
  /// ahead of what came back (allreduce_pair): true between hosts, over
  /// TCP, while this rank has a CPU of its own. Both ranks writing a whole
  /// megabyte at once makes TCP retransmit what it took for lost (each
  /// host's CPU also runs the other's receiving), three times slower than
  /// segments that wait for the peer's; ranks that share a CPU are paced by
  /// it already, and more messages only cost them more.
  virtual bool paced(int /*peer*/) const { return false; }
  /// Whether a message take() returns from `peer` (one no receive was
  /// posted for) is a buffer of this rank's own, which the algorithm may
  /// write: where sends to the peer copy the bytes, its messages here are
  /// copies too; a rank of this process hands over its own memory.
  bool owns_received(int peer) const { return copies_on_send(peer); }

  /// Takes the message of step `step` from `peer`, if it arrived; otherwise
  /// remembers what the algorithm waits for (for timeout messages). An
  /// undefined tensor: consume_on_arrival's `fn` consumed it.
  virtual std::optional<tensor> take(int peer, std::uint32_t step);

  /// What a receiving thread does with a message as it arrives.
  using arrival_fn = std::function<void(const tensor&)>;
  /// Asks that the message of step `step` from `peer` be handed to `fn` on
  /// the thread that receives it, as soon as it arrives: for large transfers
  /// between processes the data plane's reader thread then reduces while
  /// this thread sends (and reduces bytes still in its cache). take() then
  /// returns an undefined tensor, or throws what `fn` threw. `fn` may run
  /// until the operation ends, concurrently with this thread: it must touch
  /// only memory no later step reads or writes before take() saw it done.
  /// False when this context cannot (the peer shares this process, the
  /// waiting thread reads the connections itself, or the message is already
  /// here): then take it as usual.
  virtual bool consume_on_arrival(int /*peer*/, std::uint32_t /*step*/, arrival_fn /*fn*/) {
    return false;
  }
  /// Asks that the payload of step `step` from `peer`, when it is exactly
  /// `out`'s size and dtype, be received straight into `out` (between
  /// processes: the receiver then copies nothing). `out` must be memory no
  /// step writes, and no pending send reads, before take() returned the
  /// message; what take() returns may then be `out` itself. Ignored where
  /// the context cannot.
  virtual void post_receive(int /*peer*/, std::uint32_t /*step*/, const tensor& /*out*/) {}

  /// Stores a message that arrived (used by whoever runs the algorithm):
  /// records the sender's fingerprint `fp` (its first message carries it)
  /// and drops what a peer that disagrees sent.
  void deliver(int peer, std::uint32_t step, tensor payload, const fingerprint_ptr& fp = nullptr);
  /// Records `peer`'s fingerprint alone (before its messages are delivered).
  void heard(int peer, const fingerprint_ptr& fp) { agree_.heard(peer, fp); }
  /// Once the algorithm made its first progress: tells this rank's
  /// fingerprint to every peer it sent nothing yet. Riding the data, it
  /// tells none: tell_successor() does.
  void describe_to_rest();
  /// Riding the data: tells this rank's fingerprint to its ring successor
  /// if nothing went there yet, so that a disagreement anywhere, which
  /// differs between two neighbours, is found without the algorithm
  /// (base/agreement.hpp). Needed only where the calls differ: the inline
  /// engine tells it once a call waited successor_delay (a call that ends
  /// sooner agreed), the group actors at once.
  void tell_successor();
  /// Whether tell_successor() has anything to do for this call (riding the
  /// data without rounds of dissemination); known once the topology is set.
  bool owes_successor() const noexcept { return gated_ && rides_ && rounds_ == 0; }
  /// Whether the call may complete as far as the agreement goes: false while
  /// a peer's fingerprint is missing; throws disagreement_error once every
  /// fingerprint arrived and one differs. Riding the data: true until a
  /// disagreement is found or alarmed, then every peer is alarmed and the
  /// full exchange decides.
  bool settled();
  /// Whether every peer's fingerprint is awaited (not riding the data, or
  /// switched to the full exchange): a peer not heard from has not joined.
  bool awaits_everyone() const noexcept { return !rides_ || full_; }
  /// Whether a peer's call is known to differ (the algorithm need not go on).
  bool disagrees() const noexcept { return agree_.differs(); }
  /// The agreement so far.
  const agreement& agreed() const noexcept { return agree_; }
  /// The peer of the last message take() did not find (-1: none yet).
  int blocked_peer() const noexcept { return blocked_peer_; }
  /// How timeout messages name group rank `peer`: "rank 2", or where the
  /// transport knows more, "rank 2 (world rank 5 (host h1, pid 4242))".
  virtual std::string describe_peer(int peer) const;
  /// "rank 2 (step 1)": the last message take() did not find.
  std::string waiting_for() const;
  /// What blocked_peer() has not done yet: "send its data (rank 2 (step
  /// 1))", "join this allreduce (nothing of this sequence number arrived
  /// from it)", or riding the data, where a peer that joined tells only some
  /// ranks at once, "join this allreduce or send its data (...)".
  std::string blocked_on() const;

 protected:
  /// Hands `payload` to the transport; `fp` is set on the first message to `peer`.
  virtual void transmit(int peer, std::uint32_t step, tensor payload, fingerprint_ptr fp) = 0;

 private:
  /// Lets the agreement ride with the data where agreement_rides_data says
  /// so for this group (its size, whether it spans hosts: the topology),
  /// with rounds of dissemination unless result_needs_every_rank.
  void ride_agreement_on_data();

  int rank_;
  int size_;
  collective_call& call_;
  agreement agree_;
  bool gated_;            // every peer's fingerprint is awaited (all but monitored_barrier)
  bool rides_ = false;    // the agreement rides with the data (base/agreement.hpp)
  bool full_ = false;     // riding, switched to the full exchange (a disagreement)
  bool alarmed_ = false;  // a peer said it found a disagreement
  int rounds_ = 0;        // riding: rounds of dissemination this call adds
  int round_ = 0;         // the round this rank waits for
  bool round_sent_ = false;
  std::map<std::pair<std::uint32_t, int>, tensor> inbox_;  // (step, src) -> payload
  int blocked_peer_ = -1;
  std::uint32_t blocked_step_ = 0;
  std::shared_ptr<const group_topology> topology_;
};

class algorithm {
 public:
  virtual ~algorithm() = default;
  /// Advances as far as possible; returns true when finished.
  virtual bool progress(op_context& ctx) = 0;
  /// The message of a timeout error (default: the ranks that never joined
  /// the call, else what ctx waits for).
  virtual std::string on_timeout(op_context& ctx);
};

/// Chooses the algorithm for a call of `size` ranks (by op code, bytes,
/// rank count and where the ranks live, `topology`, when the engine knows
/// it: algorithms/select.cpp).
std::unique_ptr<algorithm> make_algorithm(const collective_call& call, int rank,
                                          const group_topology& topology, int size);
/// Whether an alltoall of even splits (collective_call::even_splits) of
/// `size` ranks on `topology` runs Bruck's steps rather than the pairwise
/// exchange (the cost model's choice, or TROUPE_ALGORITHMS's).
bool alltoall_runs_bruck(const collective_call& call, const group_topology& topology, int size);
/// A hierarchy's step across hosts: `part` (an allreduce, allgatherv or
/// reduce_scatterv) among `hosts` ranks, one on each host, as `m` chooses
/// (blocks of different sizes: the ring).
std::unique_ptr<algorithm> make_across_hosts(const collective_call& part, int hosts,
                                             const cost_model& m);
/// What make_algorithm runs for `call` (other: gather, scatter and the
/// barriers' one algorithm each).
algorithm_kind call_algorithm(const collective_call& call, const group_topology& topology,
                              int size);

// -- helpers shared by the algorithm files --------------------------------------

/// Balanced split of n elements into `parts` chunks: [offset, count] of chunk i.
std::pair<std::int64_t, std::int64_t> chunk_range(std::int64_t n, int parts, int i);
/// Slice s of k of every block of a buffer of blocks (counts[b] elements
/// each, in order): what the striped hierarchies' slices (in_slices) move.
class block_slices {
 public:
  block_slices(const std::vector<std::int64_t>& counts, int k, int s);
  /// The elements of block b's slice.
  std::int64_t count(int b) const {
    return chunk_range(counts_[static_cast<std::size_t>(b)], k_, s_).second;
  }
  /// Block b's slice of `buffer` (the blocks, or block b alone when
  /// `alone`).
  tensor of(const tensor& buffer, int b, bool alone = false) const;

 private:
  const std::vector<std::int64_t>& counts_;
  std::vector<std::int64_t> offsets_;
  int k_, s_;
};
/// Each host's part of a buffer of blocks (counts[b] elements of rank b):
/// the sum of its ranks' counts.
std::vector<std::int64_t> host_totals(const group_topology& t,
                                      const std::vector<std::int64_t>& counts);
/// Copies a buffer of blocks between rank order (`ranks`: block b at
/// sum(counts[<b])) and host order (`hosts`: each host's ranks' blocks in
/// local order, host by host), into `hosts` where `to_hosts`, else back.
void reorder_by_host(const group_topology& t, const std::vector<std::int64_t>& counts,
                     const tensor& ranks, const tensor& hosts, bool to_hosts);
/// Exclusive prefix sums of counts.
std::vector<std::int64_t> offsets_of(const std::vector<std::int64_t>& counts);
/// Throws when `payload` does not hold `count` elements of the call's dtype.
void check_payload(const collective_call& call, const tensor& payload, std::int64_t count, int peer,
                   std::uint32_t step);
/// A new owned buffer holding a copy of `src`.
tensor fresh_copy(const tensor& src);
/// Checks that `payload` from `peer` (message `step`) fits `out`, then copies
/// it there.
void place(const collective_call& call, const tensor& payload, tensor out, int peer,
           std::uint32_t step);
/// place() as an arrival handler (consume_on_arrival) for `out`.
op_context::arrival_fn place_on_arrival(const collective_call& call, tensor out, int peer,
                                        std::uint32_t step);
/// The message of step `step` from `peer` belongs in `out` (see
/// post_receive for what `out` must be): posts the receive and has the
/// receiving thread place it there (consume_on_arrival) where it can.
void receive_into(op_context& ctx, const collective_call& call, int peer, std::uint32_t step,
                  const tensor& out);
/// A rank that leads nothing, in a hierarchy through its host's first rank
/// (`leader`): sends `mine()` there as step `to` once (`started`), then
/// takes its result, step `from`, straight into the call's output. True
/// once the result is there.
bool follow_leader(op_context& ctx, int leader, std::uint32_t to, std::uint32_t from,
                   const std::function<tensor()>& mine, bool& started);
/// Whether the memory of `a` and `b` overlaps (either undefined: no).
bool overlaps(const tensor& a, const tensor& b);
/// What to send of `t` (the caller's memory, written later) to `peer`: `t`
/// itself where the transport copies the bytes before send returns, else a
/// fresh copy.
tensor to_send(const op_context& ctx, int peer, const tensor& t);
/// A new owned buffer holding a op b (elementwise; SUM for AVG/PREMUL_SUM).
tensor combine(const reduce_op& op, const tensor& a, const tensor& b);
/// combine(op, a, b) written over b, a message from `peer` this rank owns
/// (op_context::owns_received): no new buffer to fault in, and the result
/// lands where the message is still in the cache. Else a new buffer, as
/// combine. The same bits either way.
tensor combine_received(const op_context& ctx, int peer, const reduce_op& op, const tensor& a,
                        const tensor& b);
/// This rank's contribution: `input` scaled by the PREMUL_SUM scale (a new
/// buffer), or `input` itself for other ops.
tensor own_contribution(const collective_call& call, const tensor& input);
/// A host stage's reduction: takes the step-`step` message of each rank of
/// `from` (group ranks, in order) whose slot of `parts` is still empty,
/// each of `count` elements; once every slot is full, reduces them in that
/// order with `op` into `out` (a new buffer where `out` is undefined; else
/// `count` elements that no part overlaps but one exactly, written a chunk
/// at a time), clears `parts` and answers true. False while a message is
/// missing.
bool reduce_in_order(op_context& ctx, const std::vector<int>& from, std::uint32_t step,
                     std::int64_t count, const reduce_op& op, std::vector<tensor>& parts,
                     tensor& out);
/// The op partial results are combined with on their way: SUM for AVG and
/// PREMUL_SUM (scaled at the start, divided at the end), else `op`.
reduce_op partial_op(const reduce_op& op);
/// Applies AVG's division (by size × avg_local) in place; no-op for other ops.
void finish_reduction(const collective_call& call, tensor& data, int size);
/// Takes the step-0 message of every peer whose `done` entry is false, hands it
/// to `use(peer, payload)` and marks it done; true once every peer is done.
template <class F>
bool collect_from_peers(op_context& ctx, std::vector<bool>& done, F&& use) {
  bool all = true;
  for (int p = 0; p < ctx.size(); ++p) {
    if (done[static_cast<std::size_t>(p)]) continue;
    auto in = ctx.take(p, 0);
    if (!in) {
      all = false;
      continue;
    }
    use(p, *in);
    done[static_cast<std::size_t>(p)] = true;
  }
  return all;
}

/// Pipelined algorithms cut buffers into segments of about 1 MiB (or
/// `segment_bytes`), a few in flight at a time: how many segments
/// `elements` of `t` make (at least 1).
int segments_of(std::int64_t elements, dtype t, std::size_t segment_bytes = std::size_t{1} << 20);

/// Group rank `r` shifted by `d` around the ring.
inline int ring(int r, int d, int size) {
  return ((r + d) % size + size) % size;
}

/// Whether n (> 0) is a power of two.
inline bool power_of_two(int n) {
  return (n & (n - 1)) == 0;
}

/// How many of slots 0 .. n-1 have bit `k` (a power of two) set: the blocks
/// Bruck's alltoall moves at step k.
inline int slots_with_bit(int n, int k) {
  return n / (2 * k) * k + std::max(0, n % (2 * k) - k);
}

/// The order of a ring algorithm's ranks: host by host where the hosts are
/// known (the ring then crosses between hosts once per host, not once per
/// rank), else by rank.
class ring_order {
 public:
  ring_order(const group_topology& t, int size);
  /// The rank `d` places after rank `r` around the ring.
  int shifted(int r, int d) const {
    return identity_ ? ring(r, d, size_)
                     : at_[static_cast<std::size_t>(ring(position(r), d, size_))];
  }
  /// Rank r's place on the ring.
  int position(int r) const { return identity_ ? r : pos_[static_cast<std::size_t>(r)]; }

 private:
  int size_;
  bool identity_ = true;
  std::vector<int> at_, pos_;
};

}  // namespace troupe::detail
