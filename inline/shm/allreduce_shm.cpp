// allreduce_shm — allreduce through the group's shared segment: the
// operation's shared steps and the choice of its strategy
// (allreduce_shm_op.hpp lists them; each has a file of its own).
//
// Terms: k is the inline operation number, N the buffer's bytes, n the
// ranks. Sums run in rank order 0..n-1 wherever they run, so every rank gets
// bit-identical results.
// Step 1 (post): once every rank finished operation k-2 (whose slots this one
//   reuses), write the descriptor (size, dtype, op) and, when the strategy
//   is already `small`, the data itself; publish arrived = k.
// Step 2 (agree): wait until every rank arrived; all must have posted the
//   same descriptor (else every rank fails the same way). A rank that issued
//   another collective at this sequence number is a collective mismatch.
// Step 3: the strategy reduces; done = k.
//
// Which strategy runs (the same on every rank: sizes, the group's shape,
// and between processes whether every rank's buffer is shared, which the
// descriptors tell):
//   N <= tiny_bytes (and every barrier)                      tiny
//   N fits a small slot, ranks of one process up to 32 KiB,
//     ranks of several processes up to 32 KiB               small (data with the descriptor)
//   N fits a small slot, above 32 KiB, several processes:
//     every buffer shared                                   direct
//     else                                                  small_staged (copied after agreeing)
//   larger N: ranks of one process, or every buffer shared  direct
//     else, 2 ranks                                         chunked_pair
//     else                                                  chunked
// A reduce is the same operation with one root: only the root's buffer is
// written, so it never costs more than the allreduce of its buffer.

#include "inline/shm/allreduce_shm.hpp"

#include <algorithm>

#include "base/call.hpp"
#include "inline/medium.hpp"
#include "inline/shm/allreduce_shm_op.hpp"
#include "inline/shm/segment.hpp"
#include "kernels/reduce_kernels.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {
namespace {

/// Above this size ranks of one process reduce straight from each other's
/// buffers rather than through slots; between processes a slot-sized
/// buffer above it goes direct when every rank's buffer is shared, and is
/// copied into its slot only once the descriptors show that one is private
/// (shared buffers skip the copy into slots; a private one loses nothing by
/// being copied after the descriptors).
constexpr std::uint64_t direct_from_bytes = 32 << 10;

}  // namespace

bool allreduce_shm::step(inline_context& ctx, bool& moved) {
  if (!advance(ctx, moved)) return false;
  if (data_is_output_) sole_output = std::move(data_);
  return true;
}

allreduce_shm::strategy allreduce_shm::select_early(const inline_context& ctx) const {
  const auto nbytes = static_cast<std::uint64_t>(data_.nbytes());
  if (nbytes <= tiny_bytes) return strategy::tiny;
  const bool fits_slot = nbytes <= ctx.seg->shape().small_bytes;
  if (fits_slot && nbytes <= direct_from_bytes) return strategy::small;
  if (fits_slot && !ctx.one_process && !ctx.peers) return strategy::small;
  return strategy::undecided;
}

allreduce_shm::strategy allreduce_shm::select(inline_context& ctx) const {
  const auto nbytes = static_cast<std::uint64_t>(data_.nbytes());
  const bool shared = all_shared(ctx);
  if (nbytes <= ctx.seg->shape().small_bytes && !ctx.one_process)
    return shared ? strategy::direct : strategy::small_staged;
  if (ctx.one_process || shared) return strategy::direct;
  return ctx.size == 2 ? strategy::chunked_pair : strategy::chunked;
}

bool allreduce_shm::advance(inline_context& ctx, bool& moved) {
  if (phase_ == phase::post && strategy_ == strategy::undecided) strategy_ = select_early(ctx);
  if (strategy_ == strategy::tiny) return step_tiny(ctx, moved);
  auto& seg = *ctx.seg;
  const auto me = ctx.rank;
  const auto nbytes = static_cast<std::uint64_t>(data_.nbytes());
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
      // Whether the buffers are shared decides the strategy: say it.
      if (ctx.peers && strategy_ != strategy::small) describe_shared(seg.descriptor(me, op), data_);
      if (strategy_ == strategy::small)
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
      if (strategy_ == strategy::undecided) strategy_ = select(ctx);
      return run(ctx, moved);
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
      return strategy_ == strategy::chunked_pair ? run_chunks_pair(ctx, moved)
                                                 : run_chunks(ctx, moved);
  }
}

bool allreduce_shm::run(inline_context& ctx, bool& moved) {
  switch (strategy_) {
    case strategy::small:
      reduce_small(ctx);
      finish_op(ctx, moved);
      return true;
    case strategy::small_staged:
      copy(ctx.seg->small_slot(ctx.rank, op), static_cast<const std::byte*>(data_.data()),
           static_cast<std::int64_t>(data_.nbytes()));
      first_ = ++ctx.chunks;
      publish(ctx, &rank_progress::staged, first_, moved);
      phase_ = phase::small_staged;
      return advance(ctx, moved);
    case strategy::chunked:
    case strategy::chunked_pair:
      start_chunks(ctx);
      phase_ = phase::chunks;
      return advance(ctx, moved);
    default:  // direct
      reduce_direct(ctx);
      finish_op(ctx, moved);
      phase_ = phase::finish;
      return advance(ctx, moved);
  }
}

void allreduce_shm::check_same(inline_context& ctx, bool& moved) {
  if (auto why = disagreement(ctx); !why.empty()) {
    finish_op(ctx, moved);
    throw disagreement_error(why);
  }
}

bool allreduce_shm::all_shared(inline_context& ctx) const {
  if (!ctx.peers) return false;
  for (int r = 0; r < ctx.size; ++r)
    if (ctx.seg->descriptor(r, op).share_id == 0) return false;
  return true;
}

std::byte* allreduce_shm::buffer_of(inline_context& ctx, int r) const {
  return r == ctx.rank ? static_cast<std::byte*>(data_.data()) : posted_buffer(ctx, r);
}

/// [offset, count] in elements of part q of a chunk of m elements.
std::pair<std::int64_t, std::int64_t> allreduce_shm::part(std::int64_t m, int n, int q) const {
  const auto align =
      std::max<std::int64_t>(1, 64 / static_cast<std::int64_t>(element_size(data_.scalar_type())));
  const auto per = ((m + n - 1) / n + align - 1) / align * align;
  const auto begin = std::min<std::int64_t>(m, per * q);
  return {begin, std::min<std::int64_t>(m, begin + per) - begin};
}

std::unique_ptr<inline_op> make_allreduce_shm(tensor data, reduce_op::kind kind, double divisor,
                                              std::uint8_t code, int root, bool data_is_output) {
  return std::make_unique<allreduce_shm>(std::move(data), kind, divisor, code, root,
                                         data_is_output);
}

}  // namespace troupe::detail
