// direct_shm straight between the ranks' buffers (direct_shm.cpp says
// when): ranks of one process, or of several processes whose sources are
// shared (memory/peer_memory maps them). Each rank copies (reduce_scatter:
// reduces in rank order) what its own output needs of every rank's input,
// so every byte is copied once, by the rank that needs it. A gather whose
// root offered its output has every other rank write its block there
// (push) while the root copies its own.

#include "inline/shm/direct_shm_op.hpp"

#include "memory/host_memory.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

void direct_shm::own_part(inline_context& ctx) {
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

void direct_shm::pull(inline_context& ctx) {
  own_part(ctx);
  consume_range(ctx, 0, longest_source(ctx), [&](int r) { return input_of(ctx, r); });
}

void direct_shm::push(inline_context& ctx) {
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

}  // namespace troupe::detail
