#include "fabric/shm_op.hpp"

#include <cstring>

#include "actors/call.hpp"
#include "fabric/medium.hpp"
#include "fabric/peer_memory.hpp"
#include "src/stream_copy.hpp"
#include "src/host_memory.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

bool shm_op::all_reached(fabric_context& ctx, counter c, std::uint64_t value, std::string_view what,
                         bool agreeing) {
  const int r = short_of(ctx, c, value);
  if (r < 0) return true;
  if (agreeing) check_kind(ctx, r);
  return waiting(r, what);
}

bool shm_op::waiting(int r, std::string_view what) {
  blocked_rank_ = r;
  blocked_what_ = std::string(what);
  return false;
}

int shm_op::short_of(fabric_context& ctx, counter c, std::uint64_t value) {
  for (int r = 0; r < ctx.size; ++r)
    if ((ctx.seg->progress(r).*c).load(std::memory_order_acquire) < value) return r;
  return -1;
}

void shm_op::publish(fabric_context& ctx, counter c, std::uint64_t value, bool& moved) {
  (ctx.seg->progress(ctx.rank).*c).store(value, std::memory_order_release);
  ctx.seg->ring(ctx.rank);
  moved = true;
}

void shm_op::check_kind(fabric_context& ctx, int r) {
  const int other = ctx.med.announced(r, seq);
  if (other < 0 || other == code_) return;
  throw error(errc::mismatch, "collective mismatch: " + ctx.names[static_cast<std::size_t>(r)] +
                                  " called " + to_string(static_cast<op_code>(other)) +
                                  " at the same sequence number, this rank called " + name);
}

void shm_op::check_code(fabric_context& ctx, int r, bool& moved) {
  const auto& d = ctx.seg->descriptor(r, op);
  if (d.code == code_) return;
  finish_op(ctx, moved);
  throw error(errc::mismatch, "collective mismatch: " + ctx.names[static_cast<std::size_t>(r)] +
                                  " called " + to_string(static_cast<op_code>(d.code)) +
                                  " at the same sequence number, this rank called " + name);
}

void shm_op::describe_shared(op_descriptor& d, const tensor& t) {
  auto r = find_shared(t.data(), t.nbytes());
  if (!r) r = share_in_place(t.data(), t.nbytes());
  if (!r) return;
  d.share_fd = r->fd;
  d.share_id = r->id;
  d.share_size = r->size;
  d.share_offset = r->offset;
}

std::byte* shm_op::posted_buffer(fabric_context& ctx, int r) const {
  const auto& d = ctx.seg->descriptor(r, op);
  if (ctx.one_process) return reinterpret_cast<std::byte*>(d.addr);
  return ctx.peers->map(ctx.seg->identity(r).pid.load(), d, ctx.names[static_cast<std::size_t>(r)]);
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

void shm_op::finish_op(fabric_context& ctx, bool& moved) {
  // Whoever hears that the operation is done sees its streamed output.
  if (stream_output_) stream_fence();
  publish(ctx, &rank_progress::done, op, moved);
  auto& stats = fabric_stats();
  if (copied_) stats.copied.fetch_add(copied_, std::memory_order_relaxed);
  if (reduced_bytes_) stats.reduced.fetch_add(reduced_bytes_, std::memory_order_relaxed);
  copied_ = reduced_bytes_ = 0;
}

}  // namespace troupe::detail
