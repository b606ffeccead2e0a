#pragma once
// allreduce_shm — the inline engine's allreduce (and reduce, and barrier)
// through the group's shared segment: the operation, its shared steps and
// its strategies, each in a file of its own (allreduce_shm.cpp says which
// runs when):
//
//   tiny          allreduce_tiny.cpp          up to tiny_bytes, on the tiny lane
//   small         allreduce_small.cpp         the buffer in a slot, reduced in one step
//   direct        allreduce_direct.cpp        straight between the ranks' buffers
//   chunked       allreduce_chunked.cpp       chunks through staging slots (3+ ranks)
//   chunked_pair  allreduce_chunked_pair.cpp  chunks through staging slots (2 ranks)
//
// Internal to inline/shm/; make_allreduce_shm (allreduce_shm.hpp) makes one.

#include <cstdint>
#include <utility>

#include "inline/shm/shm_op.hpp"
#include "troupe/reduce_op.hpp"

namespace troupe::detail {

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

  bool step(inline_context& ctx, bool& moved) override;

  /// How the reduction runs: chosen alike on every rank (select_early, select).
  enum class strategy { undecided, tiny, small, small_staged, direct, chunked, chunked_pair };

 private:
  enum class phase { post, agree, finish, small_staged, chunks, tiny_wait };

  // -- the shared steps and the choice (allreduce_shm.cpp) -----------------------
  bool advance(inline_context& ctx, bool& moved);
  /// What the buffer's size and the group's shape decide before posting.
  strategy select_early(const inline_context& ctx) const;
  /// What every rank's descriptor decides once all posted.
  strategy select(inline_context& ctx) const;
  /// Runs the strategy chosen at the agreement.
  bool run(inline_context& ctx, bool& moved);
  /// Every rank sees the same descriptors: all fail alike and step past.
  void check_same(inline_context& ctx, bool& moved);
  /// Whether this rank's buffer gets the result (every rank's for an
  /// allreduce, the root's alone for a reduce).
  bool gets_result(const inline_context& ctx) const { return root_ < 0 || ctx.rank == root_; }
  /// Every rank posted a shared buffer (between processes: the direct path).
  bool all_shared(inline_context& ctx) const;
  /// Rank r's buffer in this process.
  std::byte* buffer_of(inline_context& ctx, int r) const;
  /// [offset, count] in elements of part q of a chunk of m elements.
  std::pair<std::int64_t, std::int64_t> part(std::int64_t m, int n, int q) const;

  // -- the strategies (one file each) ---------------------------------------------
  bool step_tiny(inline_context& ctx, bool& moved);
  void reduce_small(inline_context& ctx);
  void reduce_direct(inline_context& ctx);
  void start_chunks(inline_context& ctx);
  bool run_chunks(inline_context& ctx, bool& moved);
  bool run_chunks_pair(inline_context& ctx, bool& moved);
  /// Finishes the operation once its chunks are `done`; else remembers whom
  /// it waits for, and for what.
  bool end_chunks(inline_context& ctx, bool& moved, bool done, int rank, const char* what);

  tensor data_;
  reduce_op::kind kind_;
  double divisor_;
  int root_;             // a reduce's root (the only buffer written), or -1: an allreduce
  bool data_is_output_;  // the work completes with data_ (moved: no second copy held)
  phase phase_ = phase::post;
  strategy strategy_ = strategy::undecided;
  std::int64_t chunk_elems_ = 0;
  std::int64_t chunks_ = 0;
  std::int64_t staged_ = 0, reduced_ = 0, gathered_ = 0;  // chunks of this operation
  std::uint64_t first_ = 0;
};

}  // namespace troupe::detail
