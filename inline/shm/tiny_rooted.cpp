// tiny_rooted — a broadcast, gather or scatter of one tensor per rank on the
// segment's tiny lanes (shm_op.hpp). Each rank posts its call, and the data
// the others need of it, on its lane; once every lane holds the same call,
// each rank copies what its output needs:
//   broadcast: the root posts its tensor; every other rank copies it.
//   gather:    every rank posts its input; the root copies each into its
//              output for that rank.
//   scatter:   the root posts its inputs one after another; every other rank
//              copies its own block.
// These are direct_shm's calls on the tiny lane (inline/shm/direct_shm.cpp)
// without a planned call: a rank whose size takes it past the limit runs
// direct_shm and posts in the slots, and each side finds the other's post
// there and fails alike (check_posts), so every post here is the one
// direct_shm makes for the same call (the header: size, dtype, root, the
// hash of the counts per rank; the same data at the same place).
// Measured, 2 processes over shm: a broadcast's non-root that arrives last
// paid 4,101 instructions per call through direct_shm, about 1,100 of them
// for the planned call (built, moved into the operation, destroyed twice)
// and its layout's lookups; see bench/RESULTS.md, items 68-69.

#include "inline/shm/tiny_rooted.hpp"

#include "base/agreement.hpp"
#include "inline/shm/segment.hpp"
#include "inline/shm/shm_op.hpp"

namespace troupe::detail {
namespace {

class tiny_rooted final : public shm_op {
 public:
  tiny_rooted(op_code code, tensor data, int root, const tensor_list& root_inputs)
      : shm_op(static_cast<std::uint8_t>(code)),
        data_(std::move(data)),
        root_inputs_(root_inputs),
        block_(static_cast<std::int64_t>(data_.nbytes())),
        root_(root) {}

  bool step(inline_context& ctx, bool& moved) override {
    if (!posted_) {
      if (!tiny_lane_free(ctx)) return false;
      post(ctx, moved);
      posted_ = true;
    }
    if (!tiny_posted(ctx)) return false;
    // Every rank posted this call; its input sizes are what the counts make them.
    if (auto why = wrong_input(ctx); !why.empty()) {
      finish_op(ctx, moved);
      throw disagreement_error(why);
    }
    take(ctx);
    finish_op(ctx, moved);
    return true;
  }

 private:
  op_code code() const { return static_cast<op_code>(code_); }
  /// This rank's tensor in bytes: one rank's block (gather, scatter).
  std::int64_t block() const { return block_; }
  /// Rank r's input bytes as its counts make them, or -1: any.
  std::int64_t expected_input(int r, int size) const {
    switch (code()) {
      case op_code::gatherv:
        return block();
      case op_code::scatterv:
        return r == root_ ? block() * size : -1;
      default:
        return -1;
    }
  }

  void post(inline_context& ctx, bool& moved) {
    const bool root = ctx.rank == root_;
    tiny_header call;
    call.nbytes = static_cast<std::uint64_t>(block());
    call.dtype = static_cast<std::uint32_t>(data_.scalar_type());
    call.reduce = static_cast<std::uint32_t>(reduce_op::SUM);  // as a planned call's default
    call.root = root_;
    const void* source = nullptr;
    std::size_t bytes = 0;
    switch (code()) {
      case op_code::gatherv:
        call.counts_hash = hash_even_counts(static_cast<std::size_t>(ctx.size), data_.numel());
        source = data_.data();
        bytes = static_cast<std::size_t>(block());
        break;
      case op_code::scatterv:
        call.counts_hash = hash_even_counts(static_cast<std::size_t>(ctx.size), data_.numel());
        if (root) {
          // Its inputs one after another (its own block nobody reads).
          call.nbytes *= static_cast<std::uint64_t>(ctx.size);
          auto* lane = ctx.seg->tiny_data(ctx.rank, op);
          for (int r = 0; r < ctx.size; ++r)
            if (r != root_)
              copy(lane + r * block(), static_cast<const std::byte*>(input(r).data()), block());
        }
        break;
      default:  // broadcast
        call.counts_hash = hash_even_counts(0, 0);
        if (root) {
          source = data_.data();
          bytes = static_cast<std::size_t>(block());
        }
    }
    post_tiny(ctx, call, source, bytes, moved);
  }

  /// Why a rank's input size is not what the counts (which agree) make it,
  /// or "": the same text on every rank.
  std::string wrong_input(inline_context& ctx) const {
    for (int r = 0; r < ctx.size; ++r) {
      const auto want = expected_input(r, ctx.size);
      const auto got = static_cast<std::int64_t>(ctx.seg->tiny(r, op).nbytes);
      if (want >= 0 && got != want)
        return input_size_disagreement(r, got, data_.scalar_type(), want);
    }
    return {};
  }

  /// Copies what this rank's output needs from the lanes (its own part from
  /// its own tensors).
  void take(inline_context& ctx) {
    const int me = ctx.rank;
    auto* mine = static_cast<std::byte*>(data_.data());
    switch (code()) {
      case op_code::gatherv:
        if (me != root_) return;
        for (int r = 0; r < ctx.size; ++r) {
          auto* to = static_cast<std::byte*>(outputs[static_cast<std::size_t>(r)].data());
          const auto* from = r == me ? mine : ctx.seg->tiny_data(r, op);
          if (to != from) copy(to, from, block());
        }
        return;
      case op_code::scatterv: {
        const auto* from = me == root_ ? static_cast<const std::byte*>(input(me).data())
                                       : ctx.seg->tiny_data(root_, op) + me * block();
        if (from != mine) copy(mine, from, block());
        return;
      }
      default:  // broadcast
        if (me != root_) copy(mine, ctx.seg->tiny_data(root_, op), block());
    }
  }

  /// A scatter's root's input for rank r.
  const tensor& input(int r) const { return root_inputs_[static_cast<std::size_t>(r)]; }

  tensor data_;
  tensor_list root_inputs_;
  std::int64_t block_;  // asked by every step: kept
  int root_;
  bool posted_ = false;
};

}  // namespace

bool fits_tiny_rooted(op_code code, const tensor& t, int size) {
  const auto bytes = t.nbytes();
  switch (code) {
    case op_code::broadcast:
    case op_code::gatherv:
      return bytes <= tiny_bytes;
    case op_code::scatterv:
      // The root posts every rank's block.
      return bytes * static_cast<std::size_t>(size) <= tiny_bytes;
    default:
      return false;
  }
}

std::unique_ptr<inline_op> make_tiny_rooted(op_code code, tensor data, int root,
                                            const tensor_list& root_inputs) {
  return std::make_unique<tiny_rooted>(code, std::move(data), root, root_inputs);
}

}  // namespace troupe::detail
