// tiny_direct — direct_shm's collectives of even blocks on the segment's
// tiny lanes (shm_op.hpp). Each rank posts its call, and the data the others
// need of it, on its lane; once every lane holds the same call, each rank
// copies (reduce_scatter: reduces) what its output needs:
//   broadcast:      the root posts its tensor; every other rank copies it.
//   gather:         every rank posts its input; the root copies each into
//                   its output for that rank.
//   scatter:        the root posts its inputs one after another; every other
//                   rank copies its own block.
//   allgather:      every rank posts its input; every rank copies each into
//                   its block of the output.
//   reduce_scatter: every rank posts its input; every rank reduces its own
//                   block of all of them, in rank order (then AVG's
//                   division): the bits direct_shm and the message
//                   algorithms give.
// These are direct_shm's calls on the tiny lane (inline/shm/direct_shm.cpp)
// without a planned call: a rank whose size takes it past the limit runs
// direct_shm and posts in the slots, and each side finds the other's post
// there and fails alike (check_posts), so every post here is the one
// direct_shm makes for the same call (the header: size, dtype, reduce op,
// root, the hash of the counts per rank; the same data at the same place).
// Measured, 2 processes over shm: a broadcast's non-root that arrives last
// paid 4,101 instructions per call through direct_shm, about 1,100 of them
// for the planned call (built, moved into the operation, destroyed twice)
// and its layout's lookups; see bench/RESULTS.md, items 68-70.

#include "inline/shm/tiny_direct.hpp"

#include "base/agreement.hpp"
#include "base/small_vector.hpp"
#include "inline/shm/segment.hpp"
#include "inline/shm/shm_op.hpp"
#include "kernels/reduce_kernels.hpp"

namespace troupe::detail {
namespace {

/// One rank's block is the input (else the output) of these.
bool block_is_input(op_code c) {
  return c == op_code::broadcast || c == op_code::gatherv || c == op_code::allgatherv;
}

class tiny_direct final : public shm_op {
 public:
  explicit tiny_direct(tiny_call&& c)
      : shm_op(static_cast<std::uint8_t>(c.code)),
        call_(std::move(c)),
        block_(static_cast<std::int64_t>(block_is_input(call_.code) ? call_.input.nbytes()
                                                                    : call_.output.nbytes())),
        dtype_((call_.input.defined() ? call_.input : call_.output).scalar_type()) {}

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
  op_code code() const { return call_.code; }
  /// One rank's share in bytes (kept: asked by every step).
  std::int64_t block() const { return block_; }
  /// Rank r's input bytes as its counts make them, or -1: any.
  std::int64_t expected_input(int r, int size) const {
    switch (code()) {
      case op_code::gatherv:
      case op_code::allgatherv:
        return block();
      case op_code::scatterv:
        return r == call_.root ? block() * size : -1;
      case op_code::reduce_scatterv:
        return block() * size;
      default:
        return -1;
    }
  }
  /// Where rank r's posted data lies.
  const std::byte* lane(inline_context& ctx, int r) const { return ctx.seg->tiny_data(r, op); }
  const std::byte* input() const { return static_cast<const std::byte*>(call_.input.data()); }
  std::byte* output() const { return static_cast<std::byte*>(call_.output.data()); }

  void post(inline_context& ctx, bool& moved) {
    const bool root = ctx.rank == call_.root;
    const auto n = static_cast<std::size_t>(ctx.size);
    const auto numel = block() / static_cast<std::int64_t>(element_size(dtype_));
    tiny_header h;
    h.nbytes = call_.input.defined() ? call_.input.nbytes() : static_cast<std::uint64_t>(block());
    h.dtype = static_cast<std::uint32_t>(dtype_);
    h.reduce = static_cast<std::uint32_t>(call_.op);
    h.root = rooted(code()) ? call_.root : 0;
    h.counts_hash =
        code() == op_code::broadcast ? hash_even_counts(0, 0) : hash_even_counts(n, numel);
    const void* source = nullptr;
    std::int64_t bytes = 0;
    switch (code()) {
      case op_code::broadcast:
        if (root) source = input(), bytes = block();
        break;
      case op_code::gatherv:
      case op_code::allgatherv:
        source = input(), bytes = block();
        break;
      case op_code::reduce_scatterv:
        source = input(), bytes = block() * ctx.size;
        break;
      case op_code::scatterv:
        if (root) {
          // Its inputs one after another (its own block nobody reads).
          h.nbytes = static_cast<std::uint64_t>(block() * ctx.size);
          auto* mine = ctx.seg->tiny_data(ctx.rank, op);
          for (int r = 0; r < ctx.size; ++r)
            if (r != call_.root)
              copy(mine + r * block(), static_cast<const std::byte*>(root_input(r).data()),
                   block());
        }
        break;
      default:
        break;
    }
    post_tiny(ctx, h, source, static_cast<std::size_t>(bytes), moved);
  }

  /// Why a rank's input size is not what the counts (which agree) make it,
  /// or "": the same text on every rank.
  std::string wrong_input(inline_context& ctx) const {
    for (int r = 0; r < ctx.size; ++r) {
      const auto want = expected_input(r, ctx.size);
      const auto got = static_cast<std::int64_t>(ctx.seg->tiny(r, op).nbytes);
      if (want >= 0 && got != want) return input_size_disagreement(r, got, dtype_, want);
    }
    return {};
  }

  /// Copies (reduces) what this rank's output needs from the lanes, its own
  /// part from its own tensors.
  void take(inline_context& ctx) {
    const int me = ctx.rank, root = call_.root;
    switch (code()) {
      case op_code::broadcast:
        if (me != root) copy(output(), lane(ctx, root), block());
        return;
      case op_code::gatherv:
        if (me != root) return;
        for (int r = 0; r < ctx.size; ++r)
          place(static_cast<std::byte*>(outputs[static_cast<std::size_t>(r)].data()),
                r == me ? input() : lane(ctx, r));
        return;
      case op_code::allgatherv:
        for (int r = 0; r < ctx.size; ++r)
          place(output() + r * block(), r == me ? input() : lane(ctx, r));
        return;
      case op_code::scatterv:
        place(output(), me == root ? static_cast<const std::byte*>(root_input(me).data())
                                   : lane(ctx, root) + me * block());
        return;
      case op_code::reduce_scatterv:
        return reduce_mine(ctx);
      default:
        return;
    }
  }

  /// One block from `from` to `to`, unless it is there already (in place).
  void place(std::byte* to, const std::byte* from) {
    if (to != from) copy(to, from, block());
  }

  /// This rank's block of every rank's input reduced into its output.
  void reduce_mine(inline_context& ctx) {
    const int n = ctx.size, me = ctx.rank;
    const auto at = me * block();
    small_vector<const void*, 8> srcs(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r)
      srcs[static_cast<std::size_t>(r)] = (r == me ? input() : lane(ctx, r)) + at;
    const bool avg = call_.op == reduce_op::AVG;
    const auto count = block() / static_cast<std::int64_t>(element_size(dtype_));
    // AVG divides before the one rounding of float16/bfloat16.
    reduce_many(dtype_, avg ? reduce_op::SUM : call_.op, output(), srcs.data(), srcs.size(),
                static_cast<std::size_t>(count), avg ? static_cast<double>(n) : 0.0);
    reduced_bytes_ += static_cast<std::uint64_t>(block() * n);
  }

  /// A scatter's root's input for rank r.
  const tensor& root_input(int r) const { return call_.root_inputs[static_cast<std::size_t>(r)]; }

  tiny_call call_;
  std::int64_t block_;
  dtype dtype_;
  bool posted_ = false;
};

}  // namespace

bool fits_tiny_direct(op_code code, std::size_t block_bytes, int size) {
  switch (code) {
    case op_code::broadcast:
    case op_code::gatherv:
    case op_code::allgatherv:
      return block_bytes <= tiny_bytes;
    case op_code::scatterv:
    case op_code::reduce_scatterv:
      // The root's (every rank's) source holds every rank's block.
      return block_bytes * static_cast<std::size_t>(size) <= tiny_bytes;
    default:
      return false;
  }
}

std::unique_ptr<inline_op> make_tiny_direct(tiny_call&& c) {
  return std::make_unique<tiny_direct>(std::move(c));
}

}  // namespace troupe::detail
