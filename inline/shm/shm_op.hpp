#pragma once
// shm_op — what the inline engine's operations on the shared segment have in common
// (allreduce_shm, direct_shm): each rank publishes its progress counters in
// the segment and waits until every rank's counter reached a value; while it
// waits it remembers whom it waits for (timeouts name that rank), and a rank
// that issued another collective at this sequence number is a collective
// mismatch. Bytes copied are added to the process's inline_stats() once per
// operation.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/agreement.hpp"
#include "base/call.hpp"
#include "inline/engine.hpp"
#include "inline/shm/segment.hpp"
#include "troupe/tensor.hpp"

namespace troupe::detail {

class shm_op : public inline_op {
 public:
  std::pair<int, std::string> blocker() const override;
  int blocked_rank() const override { return blocked_rank_; }

 protected:
  explicit shm_op(std::uint8_t code) : code_(code) { steps_with_deadline = false; }

  using counter = std::atomic<std::uint64_t> rank_progress::*;
  /// True when every rank's `c` reached `value`; otherwise remembers the
  /// first rank that did not, and (`agreeing`: waiting for the ranks to post
  /// this operation, "issue this <name>") throws a mismatch when it issued
  /// another collective. `what` is a literal (kept, not copied: polled often).
  bool all_reached(inline_context& ctx, counter c, std::uint64_t value, const char* what,
                   bool agreeing = false);
  /// The first rank whose `c` is below `value`, or -1.
  static int short_of(inline_context& ctx, counter c, std::uint64_t value);
  /// Sets this rank's `c` to `value` and wakes the ranks sleeping on it.
  void publish(inline_context& ctx, counter c, std::uint64_t value, bool& moved);
  /// Remembers that this rank waits for rank `r` to `what` (blocker(); a
  /// literal, followed by the operation's name when `named`); false, for
  /// `return waiting(...)`.
  bool waiting(int r, const char* what, bool named = false);
  /// Rank r's alltoall counts as it posted them, on its tiny lane (`tiny`,
  /// after its input; never past its lane, whatever its header says) or in
  /// its counts slot: its send counts, then its receive counts.
  const std::int64_t* posted_counts(inline_context& ctx, int r, bool tiny) const {
    return tiny ? reinterpret_cast<const std::int64_t*>(
                      ctx.seg->tiny_data(r, op) +
                      tiny_splits_at(std::min<std::uint64_t>(ctx.seg->tiny(r, op).nbytes,
                                                             tiny_bytes)))
                : ctx.seg->counts(r, op);
  }
  /// What an alltoall's tiny post says in its header's counts_hash (which
  /// no agreement check of alltoall hashes): `count` + 1 when every send
  /// and receive count is `count` and the input holds them (`even`), else
  /// 0. Ranks whose posts are alike and nonzero there agree without reading
  /// each other's counts (splits_agree's every pair holds) and take each
  /// block at its place, in the line they polled where it fits.
  static std::uint64_t splits_mark(bool even, std::int64_t count) {
    return even ? static_cast<std::uint64_t>(count) + 1 : 0;
  }
  /// What rank r posted for this operation, on its tiny lane (`tiny`) or in
  /// the slots, as a fingerprint (base/agreement.hpp; alltoall's with its splits).
  call_fingerprint posted_call(inline_context& ctx, int r, bool tiny) const;
  /// posted_call() of every rank.
  std::vector<call_fingerprint> posted_calls(inline_context& ctx, bool tiny = false) const;
  /// Whether every rank's alltoall sends to each rank equal that rank's
  /// receives from it, read where they were posted.
  bool splits_agree(inline_context& ctx, bool tiny) const;
  /// Why the posted calls disagree ("" when they agree): one text on every rank.
  std::string disagreement(inline_context& ctx) const;
  /// Why the calls disagree when they agree but rank r's input is `got`
  /// bytes of `t` where its counts make it `want`.
  static std::string input_size_disagreement(int r, std::int64_t got, dtype t, std::int64_t want);
  /// Whether collective `c` names a root (its calls post it; the others post 0).
  static bool rooted(op_code c) {
    return c == op_code::broadcast || c == op_code::reduce || c == op_code::gatherv ||
           c == op_code::scatterv;
  }
  /// What descriptor `d` posted, as a fingerprint (alltoall's splits aside).
  static call_fingerprint fingerprint(const op_descriptor& d);
  /// What tiny lane header `h` posted, as a descriptor.
  static op_descriptor described(const tiny_header& h);
  // -- the tiny lane (segment.hpp): collectives whose every source fits
  //    tiny_bytes. Each rank posts its call and its source on its lane, the
  //    header stamped last, and reads what it needs from the others' lanes
  //    once all are stamped. A peer reads one line to learn that this rank
  //    posted and what (the slots' path reads its progress counters, its
  //    descriptor's two lines, its slot and its announcement: about 9 lines
  //    missed per operation and rank against 2-3 here, at 0.1-0.2 us each
  //    between cores of these machines). The lane of operation k last held
  //    k-2 or earlier: it is free once every rank finished k-2, which a rank
  //    that saw every rank stamp k-1 knows without reading their counters
  //    (ranks post an operation only once they finished the one before).
  //    Sizes on both sides of the limit take different lanes; each rank
  //    finds the other's post on the other lane (check_posts).

  /// Whether two tiny posts are the same call, as far as the header alone
  /// tells (fingerprint() of both decides where it does not).
  static bool same_post(const tiny_header& a, const tiny_header& b);
  /// Whether this rank may post on the tiny lane now; false: waiting.
  bool tiny_lane_free(inline_context& ctx);
  /// Posts `call` (its stamp is set here, last) and `bytes` of `data`, then
  /// (an alltoall's counts) `after_bytes` of `after` at tiny_splits_at(bytes).
  void post_tiny(inline_context& ctx, const tiny_header& call, const void* data, std::size_t bytes,
                 bool& moved, const void* after = nullptr, std::size_t after_bytes = 0);
  /// True once every rank posted this operation on its tiny lane and all
  /// posted the same call (else, once all posted, throws the mismatch as
  /// check_posts); false: waiting (now and then it checks whether the rank
  /// it waits for issued another collective, or this one in the slots:
  /// alltoall then sets to_slots_). posts_alike_ tells whether every
  /// header said what this rank's does (same_post).
  bool tiny_posted(inline_context& ctx);

  /// Once every rank posted this operation, on its tiny lane or in the
  /// slots (a size across the tiny lane's limit takes the other), and the
  /// calls differ: publishes done (every rank steps past the operation) and
  /// throws the mismatch, one text on every rank. Returns the first rank
  /// that has not posted, or -1 when all posted and agree.
  int check_posts(inline_context& ctx);
  /// Adds where `t`'s memory lives to `d` when ranks in other processes can
  /// map it: shared memory, or a whole large buffer of tensor::empty moved
  /// there in place (memory/host_memory.hpp share_in_place, from its second use).
  static void describe_shared(op_descriptor& d, const tensor& t);
  /// Rank r's posted buffer (its descriptor's) in this process: its address
  /// when every rank lives here, else its shared memory mapped here.
  std::byte* posted_buffer(inline_context& ctx, int r) const;
  /// Rank r's offered output (op_descriptor::out_nbytes), found as
  /// posted_buffer finds its input.
  std::byte* posted_output(inline_context& ctx, int r) const;
  /// memcpy, counted for inline_stats().
  void copy(std::byte* dst, const std::byte* src, std::int64_t bytes);
  /// copy() into this rank's output, with non-temporal stores when
  /// `stream_output_` (kernels/stream_copy.hpp; nobody else reads the output,
  /// and finish_op fences them).
  void copy_out(std::byte* dst, const std::byte* src, std::int64_t bytes);
  /// Whether outputs of `output_bytes` on each of `ranks` ranks of this host
  /// together outgrow the last-level cache (then stream them).
  static bool outgrows_cache(std::size_t output_bytes, int ranks);
  /// This rank is done with the operation: publishes done = op and adds its
  /// byte counts to the process's.
  void finish_op(inline_context& ctx, bool& moved);
  /// Throws the mismatch when rank r announced another collective at this
  /// sequence number (or this one on another engine).
  void check_kind(inline_context& ctx, int r);

  std::uint8_t code_;
  std::uint64_t copied_ = 0, reduced_bytes_ = 0;  // added to inline_stats() by finish_op
  bool stream_output_ = false;
  /// Set by tiny_posted: a rank posted this alltoall in the slots while this
  /// one posted on its tiny lane (each chooses from its own sizes, which
  /// uneven splits make differ), and no call disagrees so far: this rank
  /// moves to the slots too (a tiny post completes only once all posted tiny).
  bool to_slots_ = false;
  /// Set by tiny_posted: every rank's tiny header matched this rank's
  /// (same_post), not only its fingerprint.
  bool posts_alike_ = true;

 private:
  /// posted_buffer / posted_output: `addr` in one process, else the shared
  /// memory the descriptor's share fields describe, `nbytes` of it.
  std::byte* posted_at(inline_context& ctx, int r, std::uint64_t addr, std::uint64_t nbytes) const;
  int blocked_rank_ = -1;
  const char* blocked_what_ = "";
  bool blocked_named_ = false;
  std::uint32_t blocked_turns_ = 0;  // tiny lane: turns spent waiting
};

}  // namespace troupe::detail
