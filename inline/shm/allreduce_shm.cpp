// allreduce_shm — allreduce through the group's shared segment.
//
// Terms: k is the inline operation number, N the buffer's bytes, n the
// ranks, "part q" of a chunk the q-th of n cache-line-aligned slices; rank q
// reduces part q of every chunk (reduce-scatter), everyone copies every part
// out (allgather). Sums run in rank order 0..n-1 wherever they run, so every
// rank gets bit-identical results.
// Step 1 (post): once every rank finished operation k-2 (whose slots this one
//   reuses), write the descriptor (size, dtype, op) and, when N fits a small
//   slot, the data itself; publish arrived = k.
// Step 2 (agree): wait until every rank arrived; all must have posted the
//   same descriptor (else every rank fails the same way). A rank that issued
//   another collective at this sequence number is a collective mismatch.
// Small N (one step; the slot size is inline/shm/segment.hpp's shape_for): reduce
//   the n slots straight into the output; done = k.
//   Between processes above 32 KiB (two ranks: slots of 1 MiB), step 1 copies
//   nothing: when every rank's buffer turns out shared the operation goes
//   direct (below), else each rank copies its buffer into its slot and
//   publishes staged = a fresh chunk number, and reduces once all did
//   (measured, 2 ranks: shared 1 MiB 50-55 -> 26-31 us, 64 KiB 10 -> 3 us;
//   private buffers unchanged within the noise).
// Ranks of one process, N above 32 KiB, or ranks of several processes whose
//   buffers are all shared (tensor::empty_shared, or moved there in place;
//   memory/peer_memory maps them), N above 32 KiB (direct): reduce part (me) of every
//   rank's buffer into mine and copy it into every other buffer; done = k;
//   return once every rank is done (the others write into my buffer).
// Large N, per chunk g (a ring of `chunk_slots` staging and result slots;
// three cursors, each running ahead as far as the peers allow):
//   stage:  once every rank reduced chunk g - slots (the last reader of the
//           slot), copy the parts of my chunk that others reduce into my
//           staging slot; staged = g.
//   reduce: once every rank staged g and consumed g - slots, reduce part (me)
//           from my own buffer and the others' staging slots into the result
//           slot and my buffer; reduced = g.
//   gather: once every rank reduced g, copy the other parts of the result
//           slot into my buffer; consumed = g.
// Each rank copies about 2N bytes in all (stage (n-1)/n·N, own part N/n,
// gather (n-1)/n·N) and reads N for its reduction: one copy per hop.
// A reduce is the same operation with one root: only the root's buffer is
// written (direct: each rank reduces part (me) into the root's buffer; in
// chunks: the others skip copying results out, and with two ranks the root
// stages nothing and the other rank reduces nothing), so it never costs more
// than the allreduce of its buffer.
// Two ranks, large N: each rank reduces the whole of every chunk (no result
// slots, two cursors):
//   stage:  once the other rank reduced chunk g - slots, copy my whole chunk
//           into my staging slot; staged = g.
//   reduce: once both staged g, reduce the other's slot into my buffer in
//           place (a + b == b + a bit for bit, so both get the same bits);
//           reduced = g.
// Each rank copies N and reduces N, reading its own chunk from its cache
// right after staging it (measured, 16 and 64 MiB: 5-10 % faster than the
// reduce-scatter above, in 8 alternating runs of each).

#include "inline/shm/allreduce_shm.hpp"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "base/call.hpp"
#include "base/small_vector.hpp"
#include "base/tensor_util.hpp"
#include "inline/medium.hpp"
#include "inline/shm/segment.hpp"
#include "inline/shm/shm_op.hpp"
#include "kernels/reduce_kernels.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {
namespace {

/// Above this size ranks of one process reduce straight from each other's
/// buffers rather than through slots.
constexpr std::uint64_t direct_from_bytes = 32 << 10;

class allreduce_shm final : public shm_op {
 public:
  allreduce_shm(tensor data, reduce_op::kind kind, double divisor, std::uint8_t code, int root,
                bool data_is_output)
      : shm_op(code),
        data_(std::move(data)),
        kind_(kind),
        divisor_(divisor),
        root_(root),
        data_is_output_(data_is_output) {}

  bool step(inline_context& ctx, bool& moved) override {
    if (!advance(ctx, moved)) return false;
    if (data_is_output_) sole_output = std::move(data_);
    return true;
  }

 private:
  bool advance(inline_context& ctx, bool& moved) {
    if (data_.nbytes() <= tiny_bytes) return step_tiny(ctx, moved);
    auto& seg = *ctx.seg;
    const auto me = ctx.rank;
    const auto nbytes = static_cast<std::uint64_t>(data_.nbytes());
    // One step when the buffer fits a slot, except that ranks of one process
    // reduce straight from each other's buffers above 32 KiB.
    const bool small =
        nbytes <= seg.shape().small_bytes && !(ctx.one_process && nbytes > direct_from_bytes);
    // Between processes, a slot-sized buffer above 32 KiB goes direct when
    // every rank's buffer is shared; it is copied into its slot only once the
    // descriptors show that some buffer is private.
    const bool post_first = small && ctx.peers && nbytes > direct_from_bytes;
    const bool one_step = small && !post_first;  // the data goes with the descriptor
    switch (phase_) {
      case phase::post: {
        if (!all_reached(ctx, &rank_progress::done, op >= 2 ? op - 2 : 0,
                         "finish its previous operation"))
          return false;
        seg.descriptor(me, op) =
            op_descriptor{op, seq, nbytes, static_cast<std::uint32_t>(data_.scalar_type()),
                          // what the caller asked for (AVG: SUM, then divide)
                          static_cast<std::uint32_t>(divisor_ > 0 ? reduce_op::AVG : kind_), code_,
                          -1, reinterpret_cast<std::uint64_t>(data_.data())};
        seg.descriptor(me, op).root = std::max(root_, 0);
        if (ctx.peers && (!small || post_first)) describe_shared(seg.descriptor(me, op), data_);
        if (one_step)
          copy(seg.small_slot(me, op), static_cast<const std::byte*>(data_.data()),
               static_cast<std::int64_t>(nbytes));
        publish(ctx, &rank_progress::arrived, op, moved);
        phase_ = phase::agree;
        [[fallthrough]];
      }
      case phase::agree: {
        if (!all_reached(ctx, &rank_progress::arrived, op, "issue this ", true)) return false;
        check_same(ctx, moved);
        reduced_bytes_ = nbytes;
        if (post_first && !all_shared(ctx)) {
          copy(seg.small_slot(me, op), static_cast<const std::byte*>(data_.data()),
               static_cast<std::int64_t>(nbytes));
          first_ = ++ctx.chunks;
          publish(ctx, &rank_progress::staged, first_, moved);
          phase_ = phase::small_staged;
          return advance(ctx, moved);
        }
        if (one_step) {
          reduce_small(ctx);
          finish_op(ctx, moved);
          return true;
        }
        if (!ctx.one_process && !all_shared(ctx)) {
          const auto chunk = seg.shape().chunk_bytes / element_size(data_.scalar_type());
          chunk_elems_ = static_cast<std::int64_t>(chunk);
          chunks_ = (data_.numel() + chunk_elems_ - 1) / chunk_elems_;
          first_ = ctx.chunks + 1;
          ctx.chunks += static_cast<std::uint64_t>(chunks_);
          phase_ = phase::chunks;
          return run_chunks(ctx, moved);
        }
        reduce_direct(ctx);
        finish_op(ctx, moved);
        phase_ = phase::finish;
        [[fallthrough]];
      }
      case phase::finish:
        // The others write into this rank's buffer until they are done.
        return all_reached(ctx, &rank_progress::done, op, "finish writing this rank's output");
      case phase::small_staged:
        if (!all_reached(ctx, &rank_progress::staged, first_, "copy its buffer into its slot"))
          return false;
        reduce_small(ctx);
        finish_op(ctx, moved);
        return true;
      default:
        return run_chunks(ctx, moved);
    }
  }

  enum class phase { post, agree, finish, small_staged, chunks, tiny_wait };

  /// Up to tiny_bytes (and every barrier): on the tiny lane (shm_op.hpp),
  /// each rank reducing from the others' lanes.
  bool step_tiny(inline_context& ctx, bool& moved) {
    auto& seg = *ctx.seg;
    const auto me = ctx.rank;
    const auto nbytes = static_cast<std::uint64_t>(data_.nbytes());
    if (phase_ == phase::post) {
      if (!tiny_lane_free(ctx)) return false;
      tiny_header call;
      call.nbytes = nbytes;
      call.dtype = static_cast<std::uint32_t>(data_.scalar_type());
      call.reduce = static_cast<std::uint32_t>(divisor_ > 0 ? reduce_op::AVG : kind_);
      call.root = std::max(root_, 0);
      post_tiny(ctx, call, data_.data(), nbytes, moved);
      phase_ = phase::tiny_wait;
    }
    if (!tiny_posted(ctx)) return false;
    if (gets_result(ctx) && nbytes > 0) {
      small_vector<const void*, 8> srcs(static_cast<std::size_t>(ctx.size));
      for (int r = 0; r < ctx.size; ++r)
        srcs[static_cast<std::size_t>(r)] =
            r == me ? data_.data() : static_cast<const void*>(seg.tiny_data(r, op));
      if (ctx.size == 2 && me == 1) std::swap(srcs[0], srcs[1]);  // as reduce_small
      reduce_many(data_.scalar_type(), kind_, data_.data(), srcs.data(), srcs.size(),
                  static_cast<std::size_t>(data_.numel()), divisor_);
    }
    reduced_bytes_ = nbytes;
    finish_op(ctx, moved);
    return true;
  }

  /// Every rank sees the same descriptors: all fail alike and step past.
  void check_same(inline_context& ctx, bool& moved) {
    if (auto why = disagreement(ctx); !why.empty()) {
      finish_op(ctx, moved);
      throw disagreement_error(why);
    }
  }

  /// Whether this rank's buffer gets the result (every rank's for an
  /// allreduce, the root's alone for a reduce).
  bool gets_result(const inline_context& ctx) const { return root_ < 0 || ctx.rank == root_; }

  void reduce_small(inline_context& ctx) {
    if (!gets_result(ctx)) return;
    small_vector<const void*, 8> srcs(static_cast<std::size_t>(ctx.size));
    for (int r = 0; r < ctx.size; ++r)
      srcs[static_cast<std::size_t>(r)] =
          r == ctx.rank ? data_.data() : static_cast<const void*>(ctx.seg->small_slot(r, op));
    // Two operands: every op is commutative bit for bit (a + b == b + a in
    // IEEE arithmetic; only which of two NaNs' payloads survives can differ,
    // and the result is NaN either way), so rank 1 may put its own data first and
    // accumulate in place (measured: rank 1 took 58 µs at 1 MiB against rank
    // 0's 48 while it went through a scratch buffer). With more operands the
    // order is the rank order (sums do not associate).
    if (ctx.size == 2 && ctx.rank == 1) std::swap(srcs[0], srcs[1]);
    reduce_many(data_.scalar_type(), kind_, data_.data(), srcs.data(), srcs.size(),
                static_cast<std::size_t>(data_.numel()), divisor_);
  }

  /// Every rank posted a shared buffer (between processes: the direct path).
  bool all_shared(inline_context& ctx) const {
    if (!ctx.peers) return false;
    for (int r = 0; r < ctx.size; ++r)
      if (ctx.seg->descriptor(r, op).share_id == 0) return false;
    return true;
  }

  /// Rank r's buffer in this process.
  std::byte* buffer_of(inline_context& ctx, int r) const {
    return r == ctx.rank ? static_cast<std::byte*>(data_.data()) : posted_buffer(ctx, r);
  }

  /// Reduce part (me) of every rank's buffer straight into my buffer and
  /// copy it into every other rank's buffer (one read of N and one write of
  /// N per rank: the memory ceiling), in cache-sized pieces. A reduce writes
  /// part (me) into the root's buffer alone.
  void reduce_direct(inline_context& ctx) {
    const auto n = ctx.size;
    const auto me = ctx.rank;
    const auto es = static_cast<std::int64_t>(element_size(data_.scalar_type()));
    small_vector<std::byte*, 8> bufs(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) bufs[static_cast<std::size_t>(r)] = buffer_of(ctx, r);
    const auto [off, count] = part(data_.numel(), n, me);
    const std::int64_t piece = std::max<std::int64_t>(1, (32 << 10) / es);
    small_vector<const void*, 8> srcs(static_cast<std::size_t>(n));
    for (std::int64_t done = 0; done < count; done += piece) {
      const auto m = std::min(piece, count - done);
      const auto at = (off + done) * es;
      // The destination's first, then the others in rank order: each element
      // is reduced by one rank only, so any fixed order gives every rank the
      // same result, and this one accumulates in place.
      const int dst = root_ < 0 ? me : root_;
      std::size_t k = 0;
      srcs[k++] = bufs[static_cast<std::size_t>(dst)] + at;
      for (int r = 0; r < n; ++r)
        if (r != dst) srcs[k++] = bufs[static_cast<std::size_t>(r)] + at;
      std::byte* out = bufs[static_cast<std::size_t>(dst)] + at;
      reduce_many(data_.scalar_type(), kind_, out, srcs.data(), srcs.size(),
                  static_cast<std::size_t>(m), divisor_);
      if (root_ >= 0) continue;
      for (int r = 0; r < n; ++r)
        if (r != me) copy(bufs[static_cast<std::size_t>(r)] + at, out, m * es);
    }
  }

  /// [offset, count] in elements of part q of a chunk of m elements.
  std::pair<std::int64_t, std::int64_t> part(std::int64_t m, int n, int q) const {
    const auto align = std::max<std::int64_t>(
        1, 64 / static_cast<std::int64_t>(element_size(data_.scalar_type())));
    const auto per = ((m + n - 1) / n + align - 1) / align * align;
    const auto begin = std::min<std::int64_t>(m, per * q);
    return {begin, std::min<std::int64_t>(m, begin + per) - begin};
  }

  /// The three cursors run as far as the peers allow, each up to `slots`
  /// chunks ahead of the next: gather first (it frees slots), then reduce,
  /// then stage. A rank ahead of the others stages the next chunks instead of
  /// waiting, so the ranks need not run in lockstep.
  bool run_chunks(inline_context& ctx, bool& moved) {
    if (ctx.size == 2) return run_chunks_both(ctx, moved);
    auto& seg = *ctx.seg;
    const auto n = ctx.size;
    const auto me = ctx.rank;
    const auto es = static_cast<std::int64_t>(element_size(data_.scalar_type()));
    auto* base = static_cast<std::byte*>(data_.data());
    const auto slots = static_cast<std::int64_t>(seg.shape().chunk_slots);
    auto number = [&](std::int64_t i) { return first_ + static_cast<std::uint64_t>(i); };
    auto before = [&](std::int64_t i) {  // the chunk number `slots` earlier (0: none)
      return i >= slots ? number(i - slots) : 0;
    };
    struct chunk_view {
      std::byte* mine;
      std::int64_t bytes, my_off, my_bytes;
    };
    auto view = [&](std::int64_t i) {
      const auto begin = i * chunk_elems_;
      const auto m = std::min(chunk_elems_, data_.numel() - begin);
      const auto [off, count] = part(m, n, me);
      return chunk_view{base + begin * es, m * es, off * es, count * es};
    };
    int waiting_rank = -1;
    const char* waiting_for = "";
    for (bool progress = true; progress && gathered_ < chunks_;) {
      progress = false;
      // gather: every part of the result slot but mine into my buffer.
      if (gathered_ < reduced_) {
        const int r = short_of(ctx, &rank_progress::reduced, number(gathered_));
        if (r < 0) {
          const auto c = view(gathered_);
          const std::byte* result = seg.result(number(gathered_));
          if (gets_result(ctx)) {
            copy(c.mine, result, c.my_off);
            copy(c.mine + c.my_off + c.my_bytes, result + c.my_off + c.my_bytes,
                 c.bytes - c.my_off - c.my_bytes);
          }
          publish(ctx, &rank_progress::consumed, number(gathered_++), moved);
          progress = true;
          continue;
        }
        waiting_rank = r;
        waiting_for = "reduce its part of a chunk";
      }
      // reduce: my part, from my buffer and the others' staging slots, into
      // the result slot (free once everyone copied chunk i - slots out).
      if (reduced_ < staged_) {
        int r = short_of(ctx, &rank_progress::staged, number(reduced_));
        const char* what = "stage its chunk";
        if (r < 0) {
          r = short_of(ctx, &rank_progress::consumed, before(reduced_));
          what = "copy out an earlier chunk";
        }
        if (r < 0) {
          const auto c = view(reduced_);
          const auto g = number(reduced_);
          small_vector<const void*, 8> srcs(static_cast<std::size_t>(n));
          for (int q = 0; q < n; ++q)
            srcs[static_cast<std::size_t>(q)] = (q == me ? c.mine : seg.stage(q, g)) + c.my_off;
          std::byte* out = seg.result(g) + c.my_off;
          const auto count = c.my_bytes / es;
          reduce_many(data_.scalar_type(), kind_, out, srcs.data(), srcs.size(),
                      static_cast<std::size_t>(count), divisor_);
          if (gets_result(ctx)) copy(c.mine + c.my_off, out, c.my_bytes);
          publish(ctx, &rank_progress::reduced, number(reduced_++), moved);
          progress = true;
          continue;
        }
        if (waiting_rank < 0) {
          waiting_rank = r;
          waiting_for = what;
        }
      }
      // stage: the parts the others reduce, once everyone reduced chunk
      // i - slots (which read this slot).
      if (staged_ < chunks_) {
        const int r = short_of(ctx, &rank_progress::reduced, before(staged_));
        if (r < 0) {
          const auto c = view(staged_);
          std::byte* slot = seg.stage(me, number(staged_));
          copy(slot, c.mine, c.my_off);
          copy(slot + c.my_off + c.my_bytes, c.mine + c.my_off + c.my_bytes,
               c.bytes - c.my_off - c.my_bytes);
          publish(ctx, &rank_progress::staged, number(staged_++), moved);
          progress = true;
          continue;
        }
        if (waiting_rank < 0) {
          waiting_rank = r;
          waiting_for = "reduce an earlier chunk";
        }
      }
    }
    return end_chunks(ctx, moved, gathered_ == chunks_, waiting_rank, waiting_for);
  }

  /// Finishes the operation once its chunks are `done`; else remembers whom
  /// it waits for, and for what.
  bool end_chunks(inline_context& ctx, bool& moved, bool done, int rank, const char* what) {
    if (!done) return waiting(rank, what);
    finish_op(ctx, moved);
    return true;
  }

  /// Two ranks: both stage every chunk whole and reduce the other's copy
  /// into their buffer (the reduce cursor first: it frees slots and uses the
  /// chunk while it is in the cache; the stage cursor runs up to `slots`
  /// chunks ahead of the other rank's reduce).
  bool run_chunks_both(inline_context& ctx, bool& moved) {
    auto& seg = *ctx.seg;
    const int other = 1 - ctx.rank;
    const auto es = static_cast<std::int64_t>(element_size(data_.scalar_type()));
    const auto slots = static_cast<std::int64_t>(seg.shape().chunk_slots);
    auto number = [&](std::int64_t i) { return first_ + static_cast<std::uint64_t>(i); };
    auto chunk = [&](std::int64_t i) {
      const auto begin = i * chunk_elems_;
      return std::pair{static_cast<std::byte*>(data_.data()) + begin * es,
                       std::min(chunk_elems_, data_.numel() - begin)};
    };
    const auto& peer = seg.progress(other);
    const char* waiting_for = "";
    for (bool progress = true; progress && reduced_ < chunks_;) {
      progress = false;
      // reduce: the other's copy of chunk i into mine (I staged mine first).
      if (reduced_ < staged_) {
        if (peer.staged.load(std::memory_order_acquire) >= number(reduced_)) {
          auto [mine, count] = chunk(reduced_);
          const void* srcs[2] = {mine, seg.stage(other, number(reduced_))};
          if (gets_result(ctx))
            reduce_many(data_.scalar_type(), kind_, mine, srcs, 2, static_cast<std::size_t>(count),
                        divisor_);
          publish(ctx, &rank_progress::reduced, number(reduced_++), moved);
          progress = true;
          continue;
        }
        waiting_for = "stage its chunk";
      }
      // stage: my chunk, once the other reduced the chunk this slot held.
      if (staged_ < chunks_) {
        if (staged_ < slots ||
            peer.reduced.load(std::memory_order_acquire) >= number(staged_ - slots)) {
          auto [mine, count] = chunk(staged_);
          // A reduce's root stages nothing: nobody else reduces its chunk.
          if (root_ < 0 || ctx.rank != root_)
            copy(seg.stage(ctx.rank, number(staged_)), mine, count * es);
          publish(ctx, &rank_progress::staged, number(staged_++), moved);
          progress = true;
          continue;
        }
        if (reduced_ == staged_) waiting_for = "reduce an earlier chunk";
      }
    }
    return end_chunks(ctx, moved, reduced_ == chunks_, other, waiting_for);
  }

  tensor data_;
  reduce_op::kind kind_;
  double divisor_;
  int root_;             // a reduce's root (the only buffer written), or -1: an allreduce
  bool data_is_output_;  // the work completes with data_ (moved: no second copy held)
  phase phase_ = phase::post;
  std::int64_t chunk_elems_ = 0;
  std::int64_t chunks_ = 0;
  std::int64_t staged_ = 0, reduced_ = 0, gathered_ = 0;  // chunks of this operation
  std::uint64_t first_ = 0;
};

}  // namespace

std::unique_ptr<inline_op> make_allreduce_shm(tensor data, reduce_op::kind kind, double divisor,
                                              std::uint8_t code, int root, bool data_is_output) {
  return std::make_unique<allreduce_shm>(std::move(data), kind, divisor, code, root,
                                         data_is_output);
}

}  // namespace troupe::detail
