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
//   alltoall:       every rank posts its input, then its send and receive
//                   counts (even splits; the header says so: splits_mark);
//                   every rank copies from each lane the block sent to it.
//                   Where every header says the same even splits, the counts
//                   agree and nobody reads them: a block of up to 16 bytes
//                   comes with the line polled. A rank that passed split sizes may
//                   run direct_shm in the slots for a call that agrees with
//                   this one (a large block to itself): the others then find
//                   it there (shm_op::tiny_posted) and follow it through
//                   direct_shm, as direct_shm's own ranks on the tiny lane do.
// These are direct_shm's calls on the tiny lane (inline/shm/direct_shm.cpp)
// without a planned call: a rank whose size takes it past the limit runs
// direct_shm and posts in the slots, and each side finds the other's post
// there and fails alike (check_posts), so every post here is the one
// direct_shm makes for the same call (the header: size, dtype, reduce op,
// root, the hash of the counts per rank; the same data at the same place).
// Through direct_shm, a small broadcast's non-root that arrives last spends
// about a quarter of its instructions on the planned call (built, moved
// into the operation, destroyed twice) and its layout's lookups.
// The operation borrows the caller's tensors and lives on its stack until it
// has to wait (inline_engine::submit_borrowed): a rank whose peers posted
// first ends the call in its first step with no operation on the heap and
// no tensor copied (a tensor copy counts two owners up and down: four locked
// instructions); a rank that waits queues keep()'s copy, which holds them.

#include "inline/shm/tiny_direct.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "base/agreement.hpp"
#include "base/small_vector.hpp"
#include "base/tensor_util.hpp"
#include "inline/shm/direct_shm.hpp"
#include "inline/shm/segment.hpp"
#include "inline/shm/shm_op.hpp"
#include "kernels/reduce_kernels.hpp"

namespace troupe::detail {
namespace {

/// One rank's block is the input (else the output) of these.
bool block_is_input(op_code c) {
  return c == op_code::broadcast || c == op_code::gatherv || c == op_code::allgatherv ||
         c == op_code::alltoallv;
}

/// An alltoall's send and receive counts before its input on its lane.
std::size_t splits_bytes(int size) {
  return 2 * static_cast<std::size_t>(size) * sizeof(std::int64_t);
}

}  // namespace

tiny_direct::tiny_direct(const tiny_call& c) : shm_op(static_cast<std::uint8_t>(c.code)), call_(c) {
  const tensor& block_of = block_is_input(c.code) ? *c.input : *c.output;
  if (c.input) {
    input_ = static_cast<const std::byte*>(c.input->data());
    input_bytes_ = static_cast<std::int64_t>(c.input->nbytes());
    input_numel_ = c.input->numel();
  }
  if (c.output) {
    output_ = static_cast<std::byte*>(c.output->data());
    output_numel_ = c.output->numel();
  }
  block_ = static_cast<std::int64_t>(block_of.nbytes());
  block_numel_ = block_of.numel();
  dtype_ = (c.input ? *c.input : *c.output).scalar_type();
}

std::unique_ptr<inline_op> tiny_direct::keep() {
  std::unique_ptr<tiny_direct> k{new tiny_direct(std::move(*this))};
  auto& c = k->call_;
  if (c.input) {
    const bool same = c.output == c.input;
    k->kept_input_ = *c.input;
    c.input = &k->kept_input_;
    if (same) c.output = c.input;
  }
  if (c.output && c.output != c.input) {
    k->kept_output_ = *c.output;
    c.output = &k->kept_output_;
  }
  if (c.root_inputs) {
    k->kept_root_inputs_ = std::move(*c.root_inputs);
    c.root_inputs = &k->kept_root_inputs_;
  }
  return k;
}

bool tiny_direct::step(inline_context& ctx, bool& moved) {
  if (!advance(ctx, moved)) return false;
  if (!call_.output_is_result) return true;
  if (call_.output == &kept_output_)
    sole_output = std::move(kept_output_);
  else
    sole_output = *call_.output;
  return true;
}

std::pair<int, std::string> tiny_direct::blocker() const {
  return slots_ ? slots_->blocker() : shm_op::blocker();
}
int tiny_direct::blocked_rank() const {
  return slots_ ? slots_->blocked_rank() : shm_op::blocked_rank();
}
std::string tiny_direct::disagreement() const {
  return slots_ ? slots_->disagreement() : std::string{};
}

bool tiny_direct::advance(inline_context& ctx, bool& moved) {
  if (slots_) return slots_->step(ctx, moved);
  if (!posted_) {
    if (!tiny_lane_free(ctx)) return false;
    post(ctx, moved);
    posted_ = true;
  }
  if (!tiny_posted(ctx)) return to_slots_ ? follow_to_slots(ctx, moved) : false;
  if (code() == op_code::alltoallv) {
    // Every header said this rank's even splits: they agree, and each
    // input is what they make it (splits_mark).
    if (even_ && posts_alike_) {
      exchange_even(ctx);
      finish_op(ctx, moved);
      return true;
    }
    if (!splits_agree(ctx, true)) {
      finish_op(ctx, moved);
      throw disagreement_error(describe_disagreement(posted_calls(ctx, true)));
    }
  }
  // Every rank posted this call; its input sizes are what the counts make them.
  if (auto why = wrong_input(ctx); !why.empty()) {
    finish_op(ctx, moved);
    throw disagreement_error(why);
  }
  take(ctx);
  finish_op(ctx, moved);
  return true;
}

/// Rank r's input bytes as its counts make them, or -1: any.
std::int64_t tiny_direct::expected_input(inline_context& ctx, int r, int size) const {
  switch (code()) {
    case op_code::alltoallv: {  // what it sends adds up to its input
      const auto* sends = posted_counts(ctx, r, true);
      return std::accumulate(sends, sends + size, std::int64_t{0}) *
             static_cast<std::int64_t>(element_size(dtype_));
    }
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

void tiny_direct::post(inline_context& ctx, bool& moved) {
  const bool root = ctx.rank == call_.root;
  const auto n = static_cast<std::size_t>(ctx.size);
  const auto numel = block_numel_;
  tiny_header h;
  h.nbytes = static_cast<std::uint64_t>(input_bytes_ >= 0 ? input_bytes_ : block());
  h.dtype = static_cast<std::uint32_t>(dtype_);
  h.reduce = static_cast<std::uint32_t>(call_.op);
  h.root = rooted(code()) ? call_.root : 0;
  // (An alltoall's counts are on its lane, not hashed: its header says
  // whether they are even.)
  h.counts_hash = code() == op_code::alltoallv   ? 0
                  : code() == op_code::broadcast ? hash_even_counts(0, 0)
                                                 : hash_even_counts(n, numel);
  const void* source = nullptr;
  std::int64_t bytes = 0;
  switch (code()) {
    case op_code::broadcast:
      if (root) source = input_, bytes = block();
      break;
    case op_code::gatherv:
    case op_code::allgatherv:
      source = input_, bytes = block();
      break;
    case op_code::reduce_scatterv:
      source = input_, bytes = block() * ctx.size;
      break;
    case op_code::scatterv:
      if (root) {
        // Its inputs one after another (its own block nobody reads).
        h.nbytes = static_cast<std::uint64_t>(block() * ctx.size);
        auto* mine = ctx.seg->tiny_data(ctx.rank, op);
        for (int r = 0; r < ctx.size; ++r)
          if (r != call_.root) copy(mine + r * block(), root_input(r), block());
      }
      break;
    case op_code::alltoallv: {
      // Its whole input (its own block too: it takes that from here, which
      // an output in place does not overwrite), then its send and receive
      // counts. (One division where the two are alike: about 40 cycles each.)
      const auto sends = input_numel_ / ctx.size;
      const auto recvs = output_numel_ == input_numel_ ? sends : output_numel_ / ctx.size;
      std::int64_t counts[tiny_splits_bytes / sizeof(std::int64_t)];
      std::fill(counts, counts + n, sends);
      std::fill(counts + n, counts + 2 * n, recvs);
      // Sends that differ from the receives are a disagreement (every rank
      // sends each the same): said by the counts.
      even_ = sends == recvs && sends * ctx.size == input_numel_;
      even_bytes_ = sends * static_cast<std::int64_t>(element_size(dtype_));
      h.counts_hash = splits_mark(even_, sends);
      post_tiny(ctx, h, input_, static_cast<std::size_t>(block()), moved, counts,
                splits_bytes(ctx.size));
      return;
    }
    default:
      break;
  }
  post_tiny(ctx, h, source, static_cast<std::size_t>(bytes), moved);
}

/// A rank posted this alltoall in the slots (its split sizes took it
/// there), and the calls agree: the rest runs as direct_shm in the slots,
/// with this operation's number, sequence number and deadline.
bool tiny_direct::follow_to_slots(inline_context& ctx, bool& moved) {
  collective_call c;
  c.code = op_code::alltoallv;
  c.name = name;
  c.seq = seq;
  c.timeout = timeout;
  c.input = *call_.input;
  c.output = *call_.output;
  c.counts = split_elements(c.input, {}, ctx.size);
  c.recv_counts = split_elements(c.output, {}, ctx.size);
  slots_ = make_direct_shm_in_slots(std::move(c));
  slots_->name = name;
  slots_->reads = reads;
  slots_->seq = seq;
  slots_->op = op;
  slots_->timeout = timeout;
  slots_->deadline = deadline;
  return slots_->step(ctx, moved);
}

/// Why a rank's input size is not what the counts (which agree) make it,
/// or "": the same text on every rank.
std::string tiny_direct::wrong_input(inline_context& ctx) const {
  for (int r = 0; r < ctx.size; ++r) {
    const auto want = expected_input(ctx, r, ctx.size);
    const auto got = static_cast<std::int64_t>(ctx.seg->tiny(r, op).nbytes);
    if (want >= 0 && got != want) return input_size_disagreement(r, got, dtype_, want);
  }
  return {};
}

/// Copies (reduces) what this rank's output needs from the lanes, its own
/// part from its own tensors.
void tiny_direct::take(inline_context& ctx) {
  const int me = ctx.rank, root = call_.root;
  switch (code()) {
    case op_code::broadcast:
      if (me != root) copy(output_, lane(ctx, root), block());
      return;
    case op_code::gatherv:
      if (me != root) return;
      for (int r = 0; r < ctx.size; ++r)
        place(static_cast<std::byte*>(outputs[static_cast<std::size_t>(r)].data()),
              r == me ? input_ : lane(ctx, r));
      return;
    case op_code::allgatherv:
      for (int r = 0; r < ctx.size; ++r)
        place(output_ + r * block(), r == me ? input_ : lane(ctx, r));
      return;
    case op_code::scatterv:
      place(output_, me == root ? root_input(me) : lane(ctx, root) + me * block());
      return;
    case op_code::reduce_scatterv:
      return reduce_mine(ctx);
    case op_code::alltoallv:
      return exchange(ctx);
    default:
      return;
  }
}

/// From every rank's lane (this rank's own too) the block it sends to
/// this rank, at that rank's place in the output.
void tiny_direct::exchange(inline_context& ctx) {
  const int n = ctx.size, me = ctx.rank;
  const auto esize = static_cast<std::int64_t>(element_size(dtype_));
  const auto* recvs = posted_counts(ctx, me, true) + n;
  std::int64_t at = 0;
  for (int r = 0; r < n; ++r) {
    const auto* sends = posted_counts(ctx, r, true);
    const auto from = std::accumulate(sends, sends + me, std::int64_t{0}) * esize;
    copy(output_ + at, lane(ctx, r) + from, sends[me] * esize);
    at += recvs[r] * esize;
  }
}

/// exchange() where every rank posted the same even splits: rank r's
/// block for this rank lies at this rank's place in its input.
void tiny_direct::exchange_even(inline_context& ctx) {
  const auto b = even_bytes_;
  const auto from = ctx.rank * b;
  for (int r = 0; r < ctx.size; ++r) copy(output_ + r * b, lane(ctx, r) + from, b);
}

/// One block from `from` to `to`, unless it is there already (in place).
void tiny_direct::place(std::byte* to, const std::byte* from) {
  if (to != from) copy(to, from, block());
}

/// This rank's block of every rank's input reduced into its output.
void tiny_direct::reduce_mine(inline_context& ctx) {
  const int n = ctx.size, me = ctx.rank;
  const auto at = me * block();
  small_vector<const void*, 8> srcs(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    srcs[static_cast<std::size_t>(r)] = (r == me ? input_ : lane(ctx, r)) + at;
  const bool avg = call_.op == reduce_op::AVG;
  const auto count = block_numel_;
  // AVG divides before the one rounding of float16/bfloat16.
  reduce_many(dtype_, avg ? reduce_op::SUM : call_.op, output_, srcs.data(), srcs.size(),
              static_cast<std::size_t>(count), avg ? static_cast<double>(n) : 0.0);
  reduced_bytes_ += static_cast<std::uint64_t>(block() * n);
}

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
    case op_code::alltoallv:
      // direct_shm's choice (all_tiny): the input, then the counts.
      return block_bytes <= tiny_bytes && splits_bytes(size) <= tiny_splits_bytes;
    default:
      return false;
  }
}

}  // namespace troupe::detail
