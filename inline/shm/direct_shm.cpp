// direct_shm — broadcast, allgather, gather, scatter, reduce_scatter and alltoall among
// the ranks of one host through the group's segment. Ranks of one process
// (and, for alltoall, reduce_scatter, gather and scatter, ranks of several processes whose
// inputs peers can map: tensor::empty buffers of 64 KiB and more from their
// second use, tensor::empty_shared) go straight between their buffers: each
// rank copies (reduce_scatter: reduces) what its own output needs from the
// others' inputs, so every byte is copied once, by the rank that needs it,
// with no message, staging buffer or thread in between. Otherwise the
// sources are staged chunk by chunk through the segment's slots (below).
// A gather's root with an output of 64 KiB or more offers it instead (in
// its descriptor; shared in place between processes): every other rank
// writes its block there and returns, while the root copies its own.
//
// Calls of even blocks whose sources fit the tiny lane, which host_backend
// builds without a planned call, run as tiny_direct instead
// (inline/shm/tiny_direct.cpp): it posts there what this operation posts.
//
// Terms: k is the inline operation number; "counts" the elements per rank
// (the call's, the same on every rank); block r starts at the sum of the
// counts before r.
// Step 1 (post): once every rank finished operation k-2 (whose descriptor
//   slot this one reuses), post the descriptor: collective, dtype, reduce
//   op, root, input bytes and address, and a hash of the counts;
//   arrived = k.
// Step 2 (agree): wait until every rank arrived. Every rank checks every
//   descriptor (same collective, dtype, root, reduce op and counts; each
//   input the size the counts give it) from the descriptors alone, so all
//   ranks fail alike (and step past) or none does.
// Step 3 (pull), into this rank's output only: what the collective's layout
//   (inline/shm/direct_layout.hpp, one file per collective) says this rank
//   needs of every rank's input, copied (reduce_scatter: reduced in rank
//   order, then AVG's division; every rank reduces its own block, so the
//   results are the bits the message algorithms give); done = k.
// Step 4 (finish): return once every rank is done: until then the others
//   read this rank's input.

#include "inline/shm/direct_shm.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "base/call.hpp"
#include "base/small_vector.hpp"
#include "inline/medium.hpp"
#include "inline/shm/direct_layout.hpp"
#include "inline/shm/shm_op.hpp"
#include "kernels/reduce_kernels.hpp"
#include "memory/host_memory.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {
namespace {

class direct_shm final : public shm_op {
 public:
  explicit direct_shm(collective_call&& call)
      : shm_op(static_cast<std::uint8_t>(call.code)),
        call_(std::move(call)),
        layout_(&layout_for(call_.code)),
        element_bytes_(static_cast<std::int64_t>(element_size(element_type().scalar_type()))) {
    // alltoall in place: the others read this rank's input while its output
    // is written (and, between processes, while it is still being staged),
    // so they read a copy. (The other collectives' in-place layouts write
    // only what nobody reads.)
    if (call_.code == op_code::alltoallv && overlaps(call_.input, call_.output))
      call_.input = fresh_copy(call_.input);
  }

  /// Posts in the slots, not on the tiny lane (make_direct_shm_in_slots).
  void move_to_slots() { to_slots_ = true; }

  bool step(inline_context& ctx, bool& moved) override {
    auto& c = call_;
    switch (phase_) {
      case phase::post: {
        if (!to_slots_ && all_tiny(ctx)) {
          if (!tiny_lane_free(ctx)) return false;
          post_on_tiny_lane(ctx, moved);
          phase_ = phase::tiny;
          return step_tiny(ctx, moved);
        }
        if (!all_reached(ctx, &rank_progress::done, op >= 2 ? op - 2 : 0,
                         "finish its previous operation"))
          return false;
        // Outputs larger than the caches together go out streaming, except
        // a broadcast's between processes: its readers copy from slots one
        // root fills (measured, 2 ranks, alternating: 16 MiB 1.0-1.3 ms
        // stored as usual against 1.5-1.6 streamed, 64 MiB 4.2-4.9 against
        // 5.9-6.1; allgather and alltoall streamed: 16 MiB 1.5-2.9 ->
        // 0.8-1.2 ms, 64 MiB 8.3-11.4 -> 5.0-6.0).
        stream_output_ = outgrows_cache(c.output.defined() ? c.output.nbytes() : 0, ctx.size) &&
                         !(c.code == op_code::broadcast && !ctx.one_process);
        auto& d = ctx.seg->descriptor(ctx.rank, op);
        d = op_descriptor{};
        d.op = op;
        d.seq = seq;
        d.nbytes = c.input.defined() ? c.input.nbytes() : 0;
        d.dtype = static_cast<std::uint32_t>(element_type().scalar_type());
        d.reduce = static_cast<std::uint32_t>(c.op.op());
        d.code = code_;
        d.root = rooted(c.code) ? c.root : 0;
        d.addr = c.input.defined() ? reinterpret_cast<std::uint64_t>(c.input.data()) : 0;
        if (c.code == op_code::alltoallv) {
          // Each rank's own send and receive counts, in its small slot, read
          // by the others.
          auto* slot = reinterpret_cast<std::int64_t*>(ctx.seg->small_slot(ctx.rank, op));
          std::copy(c.counts.begin(), c.counts.end(), slot);
          std::copy(c.recv_counts.begin(), c.recv_counts.end(), slot + ctx.size);
        } else {
          d.counts_hash = hash_counts(c.counts);
        }
        // Inputs that peers can map (64 KiB and more: a buffer of its own)
        // are read in place between processes.
        // (alltoall's counts of the others are not posted yet: any source.)
        if (ctx.peers && pulls_between_processes() && c.input.defined() &&
            c.input.nbytes() >= own_mapping_bytes &&
            (c.code == op_code::alltoallv ? source_bytes(ctx, ctx.rank) > 0
                                          : read_by_others(ctx, ctx.rank)))
          describe_shared(d, c.input);
        // A gather's root offers its output to the others' writes (its own
        // input nobody reads, so the share fields are free).
        if (offers_output(ctx)) {
          if (ctx.one_process) {
            d.out_addr = reinterpret_cast<std::uint64_t>(c.output.data());
            d.out_nbytes = c.output.nbytes();
          } else if (d.share_id == 0) {
            describe_shared(d, c.output);
            if (d.share_id != 0) d.out_nbytes = c.output.nbytes();
          }
        }
        // Other small sources travel in the descriptor's slot: one step
        // (not alltoall's: its slot holds the counts).
        if (const auto mine = source_bytes(ctx, ctx.rank); c.code != op_code::alltoallv &&
                                                           mine <= small_limit(ctx) && mine > 0 &&
                                                           !read_in_place(ctx, ctx.rank))
          copy(ctx.seg->small_slot(ctx.rank, op), static_cast<const std::byte*>(c.input.data()),
               mine);
        publish(ctx, &rank_progress::arrived, op, moved);
        // What this rank's output needs of its own input is copied while
        // the others post (a gather's root copied its own block only once
        // every rank had arrived). It writes only what nobody reads (as
        // own_part always did); should the calls disagree, the call fails
        // and its output is not defined.
        own_part(ctx);
        phase_ = phase::agree;
        [[fallthrough]];
      }
      case phase::agree:
        if (!all_reached(ctx, &rank_progress::arrived, op, "issue this ", true)) return false;
        check(ctx, moved);
        if (refused_.empty() && root_offered_output(ctx)) {
          // Each rank writes its block into the root's output; the root
          // returns once all did (their done), the others at once.
          push(ctx);
          finish_op(ctx, moved);
          if (ctx.rank == c.root) {
            phase_ = phase::finish;
            return step(ctx, moved);
          }
          if (c.on_success) c.on_success();
          return true;
        }
        if (refused_.empty() && all_small(ctx)) {
          // Each source from its slot, or in place where it is shared.
          own_part(ctx);
          consume_range(ctx, 0, small_limit(ctx), [&](int r) {
            return read_in_place(ctx, r)
                       ? input_of(ctx, r)
                       : static_cast<const std::byte*>(ctx.seg->small_slot(r, op));
          });
          finish_op(ctx, moved);
          // The slots are reused at operation k+2, once every rank is done
          // with this one: no rank waits for the others here, unless they
          // read its input in place.
          if (read_in_place(ctx, ctx.rank) && read_by_others(ctx, ctx.rank)) {
            phase_ = phase::finish;
            return step(ctx, moved);
          }
          if (c.on_success) c.on_success();
          return true;
        }
        if (refused_.empty() && !ctx.one_process && !sources_shared(ctx)) {
          start_staged(ctx);
          phase_ = phase::staged;
          return run_staged(ctx, moved);
        }
        if (refused_.empty()) pull(ctx);
        finish_op(ctx, moved);
        phase_ = phase::finish;
        [[fallthrough]];
      case phase::finish:
        // Until every rank is done the others read this rank's input (and,
        // while they check, its counts): a refusing rank waits too.
        if (!all_reached(ctx, &rank_progress::done, op, "finish reading this rank's input"))
          return false;
        // Every rank checked the same arguments: all refuse alike, and step past.
        if (!refused_.empty()) throw disagreement_error(refused_);
        if (c.on_success) c.on_success();
        return true;
      case phase::staged:
        return run_staged(ctx, moved);
      case phase::tiny:
        return step_tiny(ctx, moved);
    }
    return false;
  }

 private:
  enum class phase { post, agree, finish, staged, tiny };

  /// Every source fits the tiny lane. An alltoall's ranks each decide from
  /// their own input and output, of at most tiny_bytes (every rank's when
  /// the splits are even; with uneven splits the ranks may choose
  /// differently, and those on the tiny lane then move to the slots:
  /// to_slots_), in a group of at most 32 ranks (their counts come first).
  bool all_tiny(inline_context& ctx) const {
    if (call_.code != op_code::alltoallv)
      return longest_source(ctx) <= static_cast<std::int64_t>(tiny_bytes);
    const auto& c = call_;
    const auto in = c.input.defined() ? c.input.nbytes() : 0;
    const auto out = c.output.defined() ? c.output.nbytes() : 0;
    return splits_bytes(ctx) <= tiny_splits_bytes && std::max(in, out) <= tiny_bytes;
  }
  /// alltoall's send and receive counts, after its input on the tiny lane.
  static std::size_t splits_bytes(inline_context& ctx) {
    return 2 * static_cast<std::size_t>(ctx.size) * sizeof(std::int64_t);
  }

  void post_on_tiny_lane(inline_context& ctx, bool& moved) {
    auto& c = call_;
    tiny_header call;
    call.nbytes = c.input.defined() ? c.input.nbytes() : 0;
    call.dtype = static_cast<std::uint32_t>(element_type().scalar_type());
    call.reduce = static_cast<std::uint32_t>(c.op.op());
    call.root = rooted(c.code) ? c.root : 0;
    const auto* in = c.input.defined() ? static_cast<const std::byte*>(c.input.data()) : nullptr;
    if (c.code != op_code::alltoallv) {
      call.counts_hash = hash_counts(c.counts);
      const auto mine = source_bytes(ctx, ctx.rank);
      post_tiny(ctx, call, in, static_cast<std::size_t>(std::max<std::int64_t>(mine, 0)), moved);
      return;
    }
    // alltoall: this rank's whole input, then its send and receive counts
    // (said to be even where they are, as tiny_direct's: splits_mark).
    std::array<std::int64_t, tiny_splits_bytes / sizeof(std::int64_t)> counts;
    const auto n = static_cast<std::size_t>(ctx.size);
    std::copy(c.counts.begin(), c.counts.end(), counts.begin());
    std::copy(c.recv_counts.begin(), c.recv_counts.end(), counts.begin() + n);
    const auto first = n ? counts[0] : 0;
    const bool even = std::all_of(counts.begin(), counts.begin() + 2 * n,
                                  [&](std::int64_t k) { return k == first; }) &&
                      call.nbytes == n * static_cast<std::uint64_t>(first) *
                                         static_cast<std::uint64_t>(element_bytes());
    call.counts_hash = splits_mark(even, first);
    post_tiny(ctx, call, in, call.nbytes, moved, counts.data(), splits_bytes(ctx));
  }

  /// On the tiny lane (shm_op.hpp): what this rank needs, from the others'
  /// lanes.
  bool step_tiny(inline_context& ctx, bool& moved) {
    if (!tiny_posted(ctx)) {
      if (!to_slots_) return false;
      phase_ = phase::post;  // an alltoall whose lanes differ: through the slots
      return step(ctx, moved);
    }
    auto& c = call_;
    auto why = c.code == op_code::alltoallv ? wrong_splits(ctx) : std::string{};
    if (why.empty()) why = wrong_input(ctx, [&](int r) { return ctx.seg->tiny(r, op).nbytes; });
    if (!why.empty()) {
      finish_op(ctx, moved);
      throw disagreement_error(why);
    }
    own_part(ctx);
    consume_range(ctx, 0, longest_source(ctx),
                  [&](int r) { return static_cast<const std::byte*>(ctx.seg->tiny_data(r, op)); });
    finish_op(ctx, moved);
    if (c.on_success) c.on_success();
    return true;
  }

  /// Why the alltoall splits on the tiny lanes disagree (a rank's sends to
  /// another against that rank's receives from it), or "": one text on
  /// every rank.
  std::string wrong_splits(inline_context& ctx) const {
    return splits_agree(ctx, true) ? std::string{} : describe_disagreement(posted_calls(ctx, true));
  }

  /// Why an input's size is not what the counts (which agree) make it, or
  /// "": the same text on every rank. `posted(r)`: rank r's input bytes.
  template <class Posted>
  std::string wrong_input(inline_context& ctx, const Posted& posted) const {
    const auto v = view(ctx);
    for (int r = 0; r < ctx.size; ++r) {
      const auto want = layout_->expected_input(v, r);
      const auto got = static_cast<std::int64_t>(posted(r));
      if (want >= 0 && got != want)
        return input_size_disagreement(r, got, element_type().scalar_type(), want);
    }
    return {};
  }

  /// The tensor whose dtype the call moves (gather's non-roots have no output).
  const tensor& element_type() const { return call_.input.defined() ? call_.input : call_.output; }
  /// Bytes per element (asked by every view of a step: kept).
  std::int64_t element_bytes() const { return element_bytes_; }

  /// Remembers the first disagreement (thrown once every rank is done).
  void refuse(const std::string& why) {
    if (refused_.empty()) refused_ = why;
  }

  void check(inline_context& ctx, bool& moved) {
    // What every rank called (collective, dtype, root, op, counts, splits).
    if (auto why = disagreement(ctx); !why.empty()) {
      refuse(why);
      // Another collective: its protocol on this segment differs; done here.
      if (ctx.seg->descriptor(ctx.rank, op).code != code_ || !same_codes(ctx)) {
        finish_op(ctx, moved);
        throw disagreement_error(refused_);
      }
      return;
    }
    // The calls agree, so every rank checks the sizes against the same numbers.
    if (auto why = wrong_input(ctx, [&](int r) { return ctx.seg->descriptor(r, op).nbytes; });
        !why.empty())
      refuse(why);
  }

  bool same_codes(inline_context& ctx) const {
    for (int r = 0; r < ctx.size; ++r)
      if (ctx.seg->descriptor(r, op).code != code_) return false;
    return true;
  }

  /// Rank r's send counts (alltoall), or its receive counts, as it posted
  /// them (on its tiny lane or in its small slot).
  const std::int64_t* counts_of(inline_context& ctx, int r, bool receive) const {
    return posted_counts(ctx, r, phase_ == phase::tiny) + (receive ? ctx.size : 0);
  }

  // -- between processes: through the segment's staging slots ----------------

  /// What the layout sees of the call.
  direct_view view(inline_context& ctx) const {
    return {call_,
            ctx.size,
            element_bytes(),
            {this, &ctx, [](const void* self, void* context, int r, bool receive) {
               return static_cast<const direct_shm*>(self)->counts_of(
                   *static_cast<inline_context*>(context), r, receive);
             }}};
  }
  /// Bytes of rank r's input the others may need (its "source").
  std::int64_t source_bytes(inline_context& ctx, int r) const {
    return layout_->source_bytes(view(ctx), r);
  }
  using need = direct_need;
  /// What rank `me` needs of rank r's source.
  need needed(inline_context& ctx, int me, int r) const {
    return layout_->needed(view(ctx), me, r);
  }

  /// Whether the others read rank r's small source where it is (its rank
  /// then waits until they did) rather than from its slot: between
  /// processes when it is shared; in one process from in_place_min bytes
  /// (copying it into the slot first cost more than the wait: 2 ranks,
  /// scatter and reduce_scatter of 64 KiB 6.5 us against 2.0 between
  /// processes, where inputs are shared). The same answer on every rank.
  bool read_in_place(inline_context& ctx, int r) const {
    return ctx.one_process ? source_bytes(ctx, r) >= in_place_min
                           : ctx.seg->descriptor(r, op).share_id != 0;
  }
  static constexpr std::int64_t in_place_min = std::int64_t{32} << 10;

  /// Sources up to this size go through the descriptors' small slots
  /// (unless read in place).
  static std::int64_t small_limit(inline_context& ctx) {
    return static_cast<std::int64_t>(
        std::min<std::size_t>(ctx.seg->shape().small_bytes, std::size_t{64} << 10));
  }
  /// The longest source (the same on every rank once the arguments agree).
  std::int64_t longest_source(inline_context& ctx) const {
    std::int64_t longest = 0;
    for (int r = 0; r < ctx.size; ++r) longest = std::max(longest, source_bytes(ctx, r));
    return longest;
  }
  /// (alltoall reads the others' counts and inputs in place, in one process.)
  bool all_small(inline_context& ctx) const {
    return call_.code != op_code::alltoallv && longest_source(ctx) <= small_limit(ctx);
  }

  /// Takes the operation's chunk numbers (the same on every rank) and copies
  /// what this rank needs of its own input.
  void start_staged(inline_context& ctx) {
    const auto bytes = static_cast<std::int64_t>(ctx.seg->shape().chunk_bytes);
    chunks_ = (longest_source(ctx) + bytes - 1) / bytes;
    // A source nobody else reads (a gather's root's) is not staged.
    mine_ = read_by_others(ctx, ctx.rank) ? (source_bytes(ctx, ctx.rank) + bytes - 1) / bytes : 0;
    first_ = ctx.chunks + 1;
    ctx.chunks += static_cast<std::uint64_t>(chunks_);
    own_part(ctx);
  }

  /// Copies what this rank's output needs of its own input (a reduction
  /// reads it with the others'), once per operation, within its own tensors.
  void own_part(inline_context& ctx) {
    if (own_copied_ || layout_->reduces()) return;
    own_copied_ = true;
    auto& c = call_;
    auto* in = c.input.defined() ? static_cast<const std::byte*>(c.input.data()) : nullptr;
    auto* out = c.output.defined() ? static_cast<std::byte*>(c.output.data()) : nullptr;
    const auto nd = needed(ctx, ctx.rank, ctx.rank);
    const auto in_bytes = c.input.defined() ? static_cast<std::int64_t>(c.input.nbytes()) : 0;
    const auto out_bytes = c.output.defined() ? static_cast<std::int64_t>(c.output.nbytes()) : 0;
    if (nd.from < nd.to && nd.to <= in_bytes && nd.at + (nd.to - nd.from) <= out_bytes &&
        out + nd.at != in + nd.from)
      copy_out(out + nd.at, in + nd.from, nd.to - nd.from);
  }

  /// Whether a rank other than `src` needs some of `src`'s source.
  bool read_by_others(inline_context& ctx, int src) const {
    if (layout_->reduces()) return ctx.size > 1;  // every rank reads every source
    for (int r = 0; r < ctx.size; ++r)
      if (const auto nd = needed(ctx, r, src); r != src && nd.from < nd.to) return true;
    return false;
  }

  /// Chunk i's global number.
  std::uint64_t number(std::int64_t i) const { return first_ + static_cast<std::uint64_t>(i); }

  /// Stages my chunks (once every rank consumed what the slot held) and
  /// consumes everyone's as they are staged, as far as the peers allow.
  bool run_staged(inline_context& ctx, bool& moved) {
    auto& seg = *ctx.seg;
    const auto slots = static_cast<std::int64_t>(seg.shape().chunk_slots);
    const auto bytes = static_cast<std::int64_t>(seg.shape().chunk_bytes);
    int waiting_rank = -1;
    const char* waiting_for = "";
    for (bool progress = true; progress;) {
      progress = false;
      if (consumed_ < chunks_) {
        const int r = consume(ctx, consumed_, bytes);
        if (r < 0) {
          publish(ctx, &rank_progress::consumed, number(consumed_++), moved);
          progress = true;
          continue;
        }
        waiting_rank = r;
        waiting_for = "stage its data";
      }
      if (staged_ < mine_) {
        const int r = staged_ >= slots
                          ? short_of(ctx, &rank_progress::consumed, number(staged_ - slots))
                          : -1;
        if (r < 0) {
          const auto from = staged_ * bytes;
          const auto n = std::min(bytes, source_bytes(ctx, ctx.rank) - from);
          copy(seg.stage(ctx.rank, number(staged_)),
               static_cast<const std::byte*>(call_.input.data()) + from, n);
          publish(ctx, &rank_progress::staged, number(staged_++), moved);
          progress = true;
          continue;
        }
        if (waiting_rank < 0) {
          waiting_rank = r;
          waiting_for = "copy out an earlier chunk";
        }
      }
    }
    if (consumed_ < chunks_ || staged_ < mine_) return waiting(waiting_rank, waiting_for);
    // The next operation may reuse the slots once nobody reads them.
    if (chunks_ > 0 && !all_reached(ctx, &rank_progress::consumed, number(chunks_ - 1),
                                    "copy out this operation's last chunk"))
      return false;
    if (!finished_) {
      finished_ = true;
      finish_op(ctx, moved);
    }
    if (call_.on_success) call_.on_success();
    return true;
  }

  /// Copies (reduces) what this rank needs of chunk i; -1 when done, else a
  /// rank that has not staged it yet (nothing copied then).
  int consume(inline_context& ctx, std::int64_t i, std::int64_t bytes) {
    const auto lo = i * bytes, hi = lo + bytes;
    for (int r = 0; r < ctx.size; ++r) {
      if (r == ctx.rank) continue;
      const auto nd = needed(ctx, ctx.rank, r);
      if (std::max(nd.from, lo) < std::min(nd.to, hi) &&
          ctx.seg->progress(r).staged.load(std::memory_order_acquire) < number(i))
        return r;
    }
    consume_range(ctx, lo, hi, [&](int r) { return ctx.seg->stage(r, number(i)); });
    return -1;
  }

  /// Copies (reduces) what this rank needs of bytes [lo, hi) of every
  /// source, which `at(r)` holds (from byte lo on).
  template <class Where>
  void consume_range(inline_context& ctx, std::int64_t lo, std::int64_t hi, const Where& at) {
    auto& c = call_;
    const int me = ctx.rank, n = ctx.size;
    auto part = [&](const need& nd) {
      return std::pair{std::max(nd.from, lo), std::min(nd.to, hi)};
    };
    auto* out = c.output.defined() ? static_cast<std::byte*>(c.output.data()) : nullptr;
    auto staged_at = [&](int r, std::int64_t from) { return at(r) + (from - lo); };
    if (layout_->reduces()) {
      const auto nd = needed(ctx, me, me);
      const auto [from, to] = part(nd);
      if (from >= to) return;
      small_vector<const void*, 8> srcs(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r)
        srcs[static_cast<std::size_t>(r)] =
            r == me ? static_cast<const std::byte*>(c.input.data()) + from : staged_at(r, from);
      const auto es = element_bytes();
      const auto count = (to - from) / es;
      const bool avg = c.op.op() == reduce_op::AVG;
      // AVG divides before the one rounding of float16/bfloat16.
      reduce_many(c.output.scalar_type(), avg ? reduce_op::SUM : c.op.op(),
                  out + nd.at + (from - nd.from), srcs.data(), srcs.size(),
                  static_cast<std::size_t>(count),
                  avg ? static_cast<double>(n) * static_cast<double>(c.avg_local) : 0.0);
      reduced_bytes_ += static_cast<std::uint64_t>((to - from) * n);
      return;
    }
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      const auto nd = needed(ctx, me, r);
      const auto [from, to] = part(nd);
      if (from < to) copy_out(out + nd.at + (from - nd.from), staged_at(r, from), to - from);
    }
  }

  bool pulls_between_processes() const { return layout_->pulls_between_processes(); }

  /// Between processes: every rank with something to send posted shared
  /// memory (the same answer on every rank).
  bool sources_shared(inline_context& ctx) const {
    if (!ctx.peers || !pulls_between_processes()) return false;
    for (int r = 0; r < ctx.size; ++r)
      if (source_bytes(ctx, r) > 0 && ctx.seg->descriptor(r, op).share_id == 0 &&
          read_by_others(ctx, r))
        return false;
    return true;
  }

  /// Rank r's input in this process.
  const std::byte* input_of(inline_context& ctx, int r) const { return posted_buffer(ctx, r); }

  // -- a gather: the others write into the root's output ---------------------

  /// The ranks reach each other's buffers: in one process, or between
  /// processes that map what they share.
  static bool direct(inline_context& ctx) { return ctx.one_process || ctx.peers; }
  /// This rank is the root of a call whose layout pushes to it, with an
  /// output worth mapping (in one process too: the others copy their blocks
  /// while the root copies its own).
  bool offers_output(inline_context& ctx) const {
    const auto& c = call_;
    return layout_->pushes_to_root() && direct(ctx) && ctx.rank == c.root && c.output.defined() &&
           c.output.nbytes() >= own_mapping_bytes;
  }
  /// The root posted its output (the same answer on every rank).
  bool root_offered_output(inline_context& ctx) const {
    return layout_->pushes_to_root() && direct(ctx) &&
           ctx.seg->descriptor(call_.root, op).out_nbytes != 0;
  }
  /// Writes what the root needs of this rank's input into the root's output
  /// (the root copies its own block itself: own_part).
  void push(inline_context& ctx) {
    auto& c = call_;
    const int root = c.root;
    if (ctx.rank == root) return own_part(ctx);
    const auto nd = needed(ctx, root, ctx.rank);
    if (nd.from >= nd.to) return;
    const auto& d = ctx.seg->descriptor(root, op);
    const auto in_bytes = c.input.defined() ? static_cast<std::int64_t>(c.input.nbytes()) : 0;
    const auto out_bytes = static_cast<std::int64_t>(d.out_nbytes);
    // The counts agree, so a root's output without room for the block is
    // not one a troupe rank posts.
    if (nd.to > in_bytes || nd.at < 0 || nd.at + (nd.to - nd.from) > out_bytes)
      throw error(errc::internal, std::string(to_string(c.code)) + ": the root's output of " +
                                      std::to_string(out_bytes) + " bytes has no room for " +
                                      std::to_string(nd.to - nd.from) + " bytes at " +
                                      std::to_string(nd.at));
    auto* out = posted_output(ctx, root);
    const auto* in = static_cast<const std::byte*>(c.input.data()) + nd.from;
    if (out + nd.at == in) return;  // (in one process) the block is the root's already
    // As large an output streams in the root's own copies.
    stream_output_ = outgrows_cache(static_cast<std::size_t>(out_bytes), ctx.size);
    copy_out(out + nd.at, in, nd.to - nd.from);
  }

  /// One process, or shared inputs: what this rank needs, straight from the
  /// others' inputs.
  void pull(inline_context& ctx) {
    own_part(ctx);
    consume_range(ctx, 0, longest_source(ctx), [&](int r) { return input_of(ctx, r); });
  }

  /// The layout of `c`'s collective.
  static const direct_layout& layout_for(op_code c) {
    switch (c) {
      case op_code::broadcast:
        return make_direct_broadcast();
      case op_code::allgatherv:
        return make_direct_gather(true);
      case op_code::gatherv:
        return make_direct_gather(false);
      case op_code::scatterv:
        return make_direct_scatter();
      case op_code::reduce_scatterv:
        return make_direct_reduce_scatter();
      case op_code::alltoallv:
        return make_direct_alltoall();
      default:
        throw error(errc::internal, std::string("direct_shm: no layout for ") + to_string(c));
    }
  }

  collective_call call_;  // held here: one allocation per call
  const direct_layout* layout_;
  std::int64_t element_bytes_;
  phase phase_ = phase::post;
  std::string refused_;
  // Between processes: the operation's chunks, mine among them, and the cursors.
  std::int64_t chunks_ = 0, mine_ = 0, staged_ = 0, consumed_ = 0;
  std::uint64_t first_ = 0;
  bool finished_ = false;
  bool own_copied_ = false;
};

}  // namespace

bool fits_direct_shm(const collective_call& c, int size) {
  switch (c.code) {
    case op_code::broadcast:
    case op_code::allgatherv:
    case op_code::gatherv:
    case op_code::scatterv:
      return true;
    case op_code::alltoallv:
      // Every rank posts its send and receive counts in its small slot.
      return std::size_t(size) * 2 * sizeof(std::int64_t) <= segment_shape{}.small_bytes;
    case op_code::reduce_scatterv:
      // PREMUL_SUM scales every input before the sum: the message algorithms'.
      return c.op.op() != reduce_op::PREMUL_SUM;
    default:
      return false;
  }
}

std::unique_ptr<inline_op> make_direct_shm(collective_call&& call) {
  return std::make_unique<direct_shm>(std::move(call));
}

std::unique_ptr<inline_op> make_direct_shm_in_slots(collective_call&& call) {
  auto op = std::make_unique<direct_shm>(std::move(call));
  op->move_to_slots();
  return op;
}

}  // namespace troupe::detail
