#include "inline/shm/shm_op.hpp"

#include <algorithm>
#include <cstring>

#include "base/call.hpp"
#include "inline/medium.hpp"
#include "kernels/stream_copy.hpp"
#include "memory/host_memory.hpp"
#include "memory/peer_memory.hpp"
#include "troupe/dtype.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

bool shm_op::all_reached(inline_context& ctx, counter c, std::uint64_t value, const char* what,
                         bool agreeing) {
  const int r = short_of(ctx, c, value);
  if (r < 0) return true;
  if (agreeing) {
    check_kind(ctx, r);
    // Posted on the tiny lane: the same collective of another size.
    if (ctx.seg->tiny(r, op).stamp.load(std::memory_order_acquire) == op) check_posts(ctx);
  }
  return waiting(r, what, agreeing);
}

bool shm_op::waiting(int r, const char* what, bool named) {
  blocked_rank_ = r;
  blocked_what_ = what;
  blocked_named_ = named;
  return false;
}

std::pair<int, std::string> shm_op::blocker() const {
  return {blocked_rank_,
          blocked_named_ ? std::string(blocked_what_) + name : std::string(blocked_what_)};
}

int shm_op::short_of(inline_context& ctx, counter c, std::uint64_t value) {
  for (int r = 0; r < ctx.size; ++r)
    if ((ctx.seg->progress(r).*c).load(std::memory_order_acquire) < value) return r;
  return -1;
}

void shm_op::publish(inline_context& ctx, counter c, std::uint64_t value, bool& moved) {
  (ctx.seg->progress(ctx.rank).*c).store(value, std::memory_order_release);
  ctx.seg->ring(ctx.rank);
  moved = true;
}

void shm_op::check_kind(inline_context& ctx, int r) {
  const int other = ctx.med.announced(r, seq);
  const int mine = announcement(code_, route::shm);
  // On this engine its descriptor tells (the agreement check); on another
  // engine it never comes.
  if (other < 0 || (other >> 4) == (mine >> 4)) return;
  throw error(errc::mismatch, announced_mismatch(r, other, mine, name));
}

call_fingerprint shm_op::fingerprint(const op_descriptor& d) {
  call_fingerprint f;
  const auto c = static_cast<op_code>(d.code);
  f.code = static_cast<std::uint8_t>(d.code);
  if (c == op_code::barrier || c == op_code::monitored_barrier) return f;
  f.dtype = static_cast<std::uint8_t>(d.dtype);
  if (c == op_code::allreduce || c == op_code::reduce || c == op_code::reduce_scatterv)
    f.reduce = static_cast<std::uint8_t>(d.reduce);
  if (rooted(c)) f.root = d.root;
  if ((c == op_code::allreduce || c == op_code::reduce || c == op_code::broadcast) &&
      d.dtype < dtype_count)
    f.numel = static_cast<std::int64_t>(d.nbytes / element_size(static_cast<dtype>(d.dtype)));
  if (c != op_code::alltoallv) f.counts_hash = d.counts_hash;
  return f;
}

op_descriptor shm_op::described(const tiny_header& h) {
  op_descriptor d;
  d.seq = h.seq;
  d.nbytes = h.nbytes;
  d.dtype = h.dtype;
  d.reduce = h.reduce;
  d.code = h.code;
  d.root = h.root;
  d.counts_hash = h.counts_hash;
  return d;
}

std::string shm_op::input_size_disagreement(int r, std::int64_t got, dtype t, std::int64_t want) {
  return "rank " + std::to_string(r) + " passed an input of " + std::to_string(got) + " bytes of " +
         std::string(to_string(t)) + ", which its counts make " + std::to_string(want) + " bytes";
}

namespace {

/// memcpy of up to 16 bytes into a buffer on the stack, the usual sizes
/// (an element or two) in one move each.
void copy_small(std::byte* to, const std::byte* from, std::size_t n) {
  switch (n) {
    case 16:
      return static_cast<void>(std::memcpy(to, from, 16));
    case 8:
      return static_cast<void>(std::memcpy(to, from, 8));
    case 4:
      return static_cast<void>(std::memcpy(to, from, 4));
    default:
      for (std::size_t i = 0; i < n; ++i) to[i] = from[i];
  }
}

}  // namespace

bool shm_op::same_post(const tiny_header& a, const tiny_header& b) {
  // The input's size counts where every rank passes the same (the others
  // check their sizes against the counts: uneven v-forms differ here).
  const auto c = static_cast<op_code>(a.code);
  const bool sized = c == op_code::allreduce || c == op_code::reduce || c == op_code::broadcast;
  return a.code == b.code && a.dtype == b.dtype && a.reduce == b.reduce && a.root == b.root &&
         a.counts_hash == b.counts_hash && (!sized || a.nbytes == b.nbytes);
}

bool shm_op::tiny_lane_free(inline_context& ctx) {
  return ctx.tiny_seen + 1 == op || all_reached(ctx, &rank_progress::done, op >= 2 ? op - 2 : 0,
                                                "finish its previous operation");
}

void shm_op::post_tiny(inline_context& ctx, const tiny_header& call, const void* data,
                       std::size_t bytes, bool& moved, const void* after, std::size_t after_bytes) {
  auto& h = ctx.seg->tiny(ctx.rank, op);
  // The data past the header's line first (read only after the stamp), then
  // the header's line in one burst: its fields, its first bytes of data, the
  // stamp. A peer polling the line between two stores to it takes it back,
  // and the next store waits for the line to return (a transfer between
  // cores); a call to memcpy between the fields and the stamp made that likely.
  std::byte head[sizeof h.head]{};
  const auto place = [&](std::size_t at, const void* from, std::size_t n) {
    const auto* src = static_cast<const std::byte*>(from);
    const std::size_t in_head = at < sizeof head ? std::min(n, sizeof head - at) : 0;
    if (n > in_head) std::memcpy(h.head + at + in_head, src + in_head, n - in_head);
    copy_small(head + at, src, in_head);
    return in_head ? at + in_head : 0;  // where its part of the head ends
  };
  std::size_t in_head = place(0, data, bytes);
  if (after_bytes) in_head = std::max(in_head, place(tiny_splits_at(bytes), after, after_bytes));
  h.seq = seq;
  h.nbytes = call.nbytes;
  h.dtype = call.dtype;
  h.reduce = call.reduce;
  h.code = code_;
  h.root = call.root;
  h.counts_hash = call.counts_hash;
  // (One store: what it holds past the post nobody reads. A post of no
  // bytes leaves the lane as its caller wrote it: a scatter's root's.)
  if (in_head) std::memcpy(h.head, head, sizeof head);
  h.stamp.store(op, std::memory_order_release);
  copied_ += bytes + after_bytes;
  ctx.seg->ring(ctx.rank);
  moved = true;
}

bool shm_op::tiny_posted(inline_context& ctx) {
  auto& seg = *ctx.seg;
  const auto& mine = seg.tiny(ctx.rank, op);
  for (int r = 0; r < ctx.size; ++r) {
    if (r == ctx.rank) continue;
    const auto& t = seg.tiny(r, op);
    if (t.stamp.load(std::memory_order_acquire) != op) {
      if ((++blocked_turns_ & 63) == 0) {
        check_kind(ctx, r);
        if (seg.progress(r).arrived.load(std::memory_order_acquire) >= op) {
          check_posts(ctx);
          // Only alltoall's ranks choose lanes that differ for one valid call.
          if (static_cast<op_code>(code_) == op_code::alltoallv) {
            to_slots_ = true;
            return false;
          }
        }
      }
      return waiting(r, "issue this ", true);
    }
    if (!same_post(t, mine)) {
      // Throws once every rank posted (fields that differ and mean the
      // same agree).
      if (const int q = check_posts(ctx); q >= 0) return waiting(q, "issue this ", true);
      posts_alike_ = false;
    }
  }
  ctx.tiny_seen = op;
  return true;
}

int shm_op::check_posts(inline_context& ctx) {
  std::vector<call_fingerprint> fps;
  fps.reserve(static_cast<std::size_t>(ctx.size));
  for (int q = 0; q < ctx.size; ++q) {
    if (ctx.seg->tiny(q, op).stamp.load(std::memory_order_acquire) == op)
      fps.push_back(posted_call(ctx, q, true));
    else if (ctx.seg->progress(q).arrived.load(std::memory_order_acquire) >= op)
      fps.push_back(posted_call(ctx, q, false));
    else
      return q;
  }
  const auto why = describe_disagreement(fps);
  if (why.empty()) return -1;
  bool moved = false;
  finish_op(ctx, moved);
  throw disagreement_error(why);
}

call_fingerprint shm_op::posted_call(inline_context& ctx, int r, bool tiny) const {
  auto f =
      tiny ? fingerprint(described(ctx.seg->tiny(r, op))) : fingerprint(ctx.seg->descriptor(r, op));
  if (static_cast<op_code>(f.code) == op_code::alltoallv) {
    const auto* counts = posted_counts(ctx, r, tiny);
    f.sends.assign(counts, counts + ctx.size);
    f.receives.assign(counts + ctx.size, counts + 2 * ctx.size);
  }
  return f;
}

std::vector<call_fingerprint> shm_op::posted_calls(inline_context& ctx, bool tiny) const {
  std::vector<call_fingerprint> fps;
  fps.reserve(static_cast<std::size_t>(ctx.size));
  for (int r = 0; r < ctx.size; ++r) fps.push_back(posted_call(ctx, r, tiny));
  return fps;
}

bool shm_op::splits_agree(inline_context& ctx, bool tiny) const {
  // Read in place: building every rank's split lists would cost each of n
  // ranks n lists of 2n counts (1024 ranks in one process: 16 MiB per rank
  // per call).
  const int n = ctx.size;
  for (int r = 0; r < n; ++r) {
    const auto* sends = posted_counts(ctx, r, tiny);
    for (int j = 0; j < n; ++j)
      if (sends[j] != posted_counts(ctx, j, tiny)[n + r]) return false;
  }
  return true;
}

std::string shm_op::disagreement(inline_context& ctx) const {
  // The common case costs a comparison per rank (no allocation): the
  // descriptors' fields equal this rank's (alltoall's splits aside).
  const auto& mine = ctx.seg->descriptor(ctx.rank, op);
  const bool alltoall = mine.code == static_cast<std::uint32_t>(op_code::alltoallv);
  // alltoall's counts_hash is its splits_mark, which ranks that agree may
  // post differently (even splits or not).
  bool same = true, even = alltoall && mine.counts_hash != 0;
  for (int r = 0; r < ctx.size && same; ++r) {
    const auto& d = ctx.seg->descriptor(r, op);
    same =
        d.code == mine.code && d.dtype == mine.dtype && d.reduce == mine.reduce &&
        d.root == mine.root && (alltoall || d.counts_hash == mine.counts_hash) &&
        (d.nbytes == mine.nbytes || (mine.code != static_cast<std::uint32_t>(op_code::allreduce) &&
                                     mine.code != static_cast<std::uint32_t>(op_code::broadcast) &&
                                     mine.code != static_cast<std::uint32_t>(op_code::reduce)));
    even = even && d.counts_hash == mine.counts_hash;
  }
  // Every rank's sends to each rank equal that rank's receives from it: at
  // once where every rank posted the same even splits (splits_mark).
  if (same && alltoall && !even) same = splits_agree(ctx, false);
  if (same) return {};
  return describe_disagreement(posted_calls(ctx));
}

void shm_op::describe_shared(op_descriptor& d, const tensor& t) {
  const auto r = find_or_share(t.data(), t.nbytes());
  if (!r) return;
  d.share_fd = r->fd;
  d.share_id = r->id;
  d.share_size = r->size;
  d.share_offset = r->offset;
}

std::byte* shm_op::posted_buffer(inline_context& ctx, int r) const {
  const auto& d = ctx.seg->descriptor(r, op);
  return posted_at(ctx, r, d.addr, d.nbytes);
}

std::byte* shm_op::posted_output(inline_context& ctx, int r) const {
  const auto& d = ctx.seg->descriptor(r, op);
  return posted_at(ctx, r, d.out_addr, d.out_nbytes);
}

std::byte* shm_op::posted_at(inline_context& ctx, int r, std::uint64_t addr,
                             std::uint64_t nbytes) const {
  const auto& d = ctx.seg->descriptor(r, op);
  if (ctx.one_process) return reinterpret_cast<std::byte*>(addr);
  return ctx.peers->map(ctx.seg->identity(r).pid.load(),
                        peer_buffer{d.share_fd, d.share_id, d.share_size, d.share_offset, nbytes},
                        to_string(static_cast<op_code>(d.code)),
                        ctx.names[static_cast<std::size_t>(r)]);
}

void shm_op::copy(std::byte* dst, const std::byte* src, std::int64_t bytes) {
  if (bytes <= 0) return;
  std::memcpy(dst, src, static_cast<std::size_t>(bytes));
  copied_ += static_cast<std::uint64_t>(bytes);
}

void shm_op::copy_out(std::byte* dst, const std::byte* src, std::int64_t bytes) {
  if (!stream_output_) return copy(dst, src, bytes);
  if (bytes <= 0) return;
  stream_copy(dst, src, static_cast<std::size_t>(bytes));
  copied_ += static_cast<std::uint64_t>(bytes);
}

bool shm_op::outgrows_cache(std::size_t output_bytes, int ranks) {
  return output_bytes > 0 && output_bytes * static_cast<std::size_t>(ranks) >= stream_threshold();
}

void shm_op::finish_op(inline_context& ctx, bool& moved) {
  // Whoever hears that the operation is done sees its streamed output.
  if (stream_output_) stream_fence();
  publish(ctx, &rank_progress::done, op, moved);
  if (auto* stats = inline_counting()) {
    if (copied_) stats->copied.fetch_add(copied_, std::memory_order_relaxed);
    if (reduced_bytes_) stats->reduced.fetch_add(reduced_bytes_, std::memory_order_relaxed);
  }
  copied_ = reduced_bytes_ = 0;
}

}  // namespace troupe::detail
