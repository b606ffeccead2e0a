// tiny_broadcast — a broadcast of at most tiny_bytes on the segment's tiny
// lanes (shm_op.hpp): the root posts its call and its data on its lane,
// every other rank posts its call alone, and once every lane is stamped with
// the same call each non-root copies the root's data from the root's lane.
//
// It is direct_shm's broadcast on the tiny lane (inline/shm/direct_shm.cpp)
// without a planned call: a rank that passes a size above the limit runs
// direct_shm and posts in the slots, and each side finds the other's post
// there and fails alike (check_posts), so every post here is the one
// direct_shm's broadcast makes (the same header, the same data).
// Measured, 2 processes over shm, a non-root that arrives last: 4,101
// instructions per call through direct_shm, about 1,000 of them for its
// planned call (built, moved into the operation, destroyed twice) and its
// layout's lookups; see bench/RESULTS.md, item 68.

#include "inline/shm/tiny_broadcast.hpp"

#include "base/agreement.hpp"
#include "base/call.hpp"
#include "inline/shm/segment.hpp"
#include "inline/shm/shm_op.hpp"

namespace troupe::detail {
namespace {

class tiny_broadcast final : public shm_op {
 public:
  tiny_broadcast(tensor data, int root)
      : shm_op(static_cast<std::uint8_t>(op_code::broadcast)),
        data_(std::move(data)),
        root_(root) {}

  bool step(inline_context& ctx, bool& moved) override {
    const auto nbytes = data_.nbytes();
    if (!posted_) {
      if (!tiny_lane_free(ctx)) return false;
      tiny_header call;
      call.nbytes = nbytes;
      call.dtype = static_cast<std::uint32_t>(data_.scalar_type());
      call.reduce = static_cast<std::uint32_t>(reduce_op::SUM);  // as a planned call's default
      call.root = root_;
      call.counts_hash = no_counts_hash();
      const bool source = ctx.rank == root_;
      post_tiny(ctx, call, source ? data_.data() : nullptr, source ? nbytes : 0, moved);
      posted_ = true;
    }
    if (!tiny_posted(ctx)) return false;
    // Every rank posted this call (its size too): the root's lane holds nbytes.
    if (ctx.rank != root_)
      copy(static_cast<std::byte*>(data_.data()), ctx.seg->tiny_data(root_, op),
           static_cast<std::int64_t>(nbytes));
    finish_op(ctx, moved);
    return true;
  }

 private:
  /// What a call without counts posts as their hash.
  static std::uint64_t no_counts_hash() {
    static const std::uint64_t h = hash_counts({});
    return h;
  }

  tensor data_;
  int root_;
  bool posted_ = false;
};

}  // namespace

bool fits_tiny_broadcast(const tensor& t) {
  return t.nbytes() <= tiny_bytes;
}

std::unique_ptr<inline_op> make_tiny_broadcast(tensor data, int root) {
  return std::make_unique<tiny_broadcast>(std::move(data), root);
}

}  // namespace troupe::detail
