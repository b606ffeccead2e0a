#pragma once
// direct_shm — the inline engine's broadcast, allgather, gather, scatter,
// reduce_scatter and alltoall among the ranks of one host, through the
// group's segment: the operation (direct_shm.cpp: its shared steps and the
// choice of how it runs) and the ways it runs, each in a file of its own:
//
//   tiny        direct_tiny.cpp     every source on the tiny lane
//   from_slots  direct_shm.cpp      small sources through the descriptors' slots
//   pull/push   direct_pull.cpp     straight between the buffers (a gather: into the root's)
//   staged      direct_staged.cpp   chunks through staging slots (between processes)
//
// Internal to inline/shm/; make_direct_shm (direct_shm.hpp) makes one.

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>
#include <string>
#include <utility>

#include "algorithms/algorithm.hpp"
#include "base/call.hpp"
#include "base/small_vector.hpp"
#include "inline/shm/direct_layout.hpp"
#include "inline/shm/segment.hpp"
#include "inline/shm/shm_op.hpp"
#include "kernels/reduce_kernels.hpp"
#include "memory/host_memory.hpp"

namespace troupe::detail {

class direct_shm final : public shm_op {
 public:
  explicit direct_shm(collective_call&& call)
      : shm_op(static_cast<std::uint8_t>(call.code)),
        call_(std::move(call)),
        layout_(&layout_for(call_.code)),
        element_bytes_(static_cast<std::int64_t>(element_size(element_type().scalar_type()))),
        prefix_(count_prefix(call_.code == op_code::alltoallv ? std::vector<std::int64_t>{}
                                                              : call_.counts)) {
    // alltoall in place: the others read this rank's input while its output
    // is written (and, between processes, while it is still being staged),
    // so they read a copy. (The other collectives' in-place layouts write
    // only what nobody reads.)
    if (call_.code == op_code::alltoallv && overlaps(call_.input, call_.output))
      call_.input = fresh_copy(call_.input);
  }

  /// Posts in the slots, not on the tiny lane (make_direct_shm_in_slots).
  void move_to_slots() { to_slots_ = true; }

  bool step(inline_context& ctx, bool& moved) override;

  /// How the call runs once every rank posted (select: the same on every rank).
  enum class how { refused, into_root, from_slots, staged, pull };

 private:
  enum class phase { post, agree, finish, staged, tiny };

  // -- the shared steps and the choice (direct_shm.cpp) --------------------------
  /// Step 1: posts this rank's descriptor (and a small source in its slot),
  /// once every rank finished operation k-2; false while one has not.
  bool post(inline_context& ctx, bool& moved);
  /// Step 2's verdict: every rank checks every descriptor, so all refuse alike.
  void check(inline_context& ctx, bool& moved);
  how select(inline_context& ctx) const;
  /// Step 3: runs the call as select() says.
  bool run(how h, inline_context& ctx, bool& moved);
  /// The layout of `c`'s collective.
  static const direct_layout& layout_for(op_code c);

  // -- on the tiny lane (direct_tiny.cpp) -----------------------------------------
  void post_on_tiny_lane(inline_context& ctx, bool& moved);
  /// On the tiny lane (shm_op.hpp): what this rank needs, from the others' lanes.
  bool step_tiny(inline_context& ctx, bool& moved);
  /// Why the alltoall splits on the tiny lanes disagree (a rank's sends to
  /// another against that rank's receives from it), or "": one text on
  /// every rank.
  std::string wrong_splits(inline_context& ctx) const;

  // -- straight between the buffers (direct_pull.cpp) ---------------------------
  /// Copies what this rank's output needs of its own input (a reduction
  /// reads it with the others'), once per operation, within its own tensors.
  void own_part(inline_context& ctx);
  /// One process, or shared inputs: what this rank needs, straight from the
  /// others' inputs.
  void pull(inline_context& ctx);
  /// A gather: writes what the root needs of this rank's input into the
  /// root's output (the root copies its own block itself: own_part).
  void push(inline_context& ctx);

  // -- between processes, through the staging slots (direct_staged.cpp) ---------
  /// Takes the operation's chunk numbers (the same on every rank) and copies
  /// what this rank needs of its own input.
  void start_staged(inline_context& ctx);
  /// Stages my chunks (once every rank consumed what the slot held) and
  /// consumes everyone's as they are staged, as far as the peers allow.
  bool run_staged(inline_context& ctx, bool& moved);
  /// Copies (reduces) what this rank needs of chunk i; -1 when done, else a
  /// rank that has not staged it yet (nothing copied then).
  int consume(inline_context& ctx, std::int64_t i, std::int64_t bytes);

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
            {this, &ctx,
             [](const void* self, void* context, int r, bool receive) {
               return static_cast<const direct_shm*>(self)->counts_of(
                   *static_cast<inline_context*>(context), r, receive);
             }},
            prefix_.data(),
            even_};
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
  /// (copying it into the slot first costs more than the wait). The same
  /// answer on every rank.
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

  /// Whether a rank other than `src` needs some of `src`'s source.
  bool read_by_others(inline_context& ctx, int src) const {
    if (layout_->reduces()) return ctx.size > 1;  // every rank reads every source
    for (int r = 0; r < ctx.size; ++r)
      if (const auto nd = needed(ctx, r, src); r != src && nd.from < nd.to) return true;
    return false;
  }

  /// Chunk i's global number.
  std::uint64_t number(std::int64_t i) const { return first_ + static_cast<std::uint64_t>(i); }

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

  collective_call call_;  // held here: one allocation per call
  const direct_layout* layout_;
  std::int64_t element_bytes_;
  std::vector<std::int64_t> prefix_;  // the counts summed (direct_view::prefix)
  std::int64_t even_ = -1;            // alltoall: every rank's one split (direct_view::even)
  phase phase_ = phase::post;
  std::string refused_;
  // Between processes: the operation's chunks, mine among them, and the cursors.
  std::int64_t chunks_ = 0, mine_ = 0, staged_ = 0, consumed_ = 0;
  std::uint64_t first_ = 0;
  bool finished_ = false;
  bool own_copied_ = false;
};

}  // namespace troupe::detail
