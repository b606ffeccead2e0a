// direct_shm — broadcast, allgather, gather, scatter, reduce_scatter and alltoall among
// the ranks of one process, straight between their buffers: each rank copies
// (reduce_scatter: reduces) what its own output needs from the others'
// inputs, so every byte is copied once, by the rank that needs it, with no
// message, staging buffer or thread in between.
//
// Terms: k is the fabric operation number; "counts" the elements per rank
// (the call's, the same on every rank); block r starts at the sum of the
// counts before r.
// Step 1 (post): once every rank finished operation k-2 (whose descriptor
//   slot this one reuses), post the descriptor: collective, dtype, reduce
//   op, root, input bytes and address, and a hash of the counts;
//   arrived = k.
// Step 2 (agree): wait until every rank arrived. Every rank checks every
//   descriptor (same collective, dtype, root, reduce op and counts; each
//   input the size the counts give it) from the descriptors alone, so all
//   ranks fail alike (and step past) or none does.
// Step 3 (pull), into this rank's output only:
//   broadcast       the root's input (non-roots);
//   allgather       block r from every rank r's input;
//   gather          the same, on the root only;
//   scatter         block (me) of the root's input;
//   alltoall        from every rank r, the block r sends to me (each rank
//                   posts where its send and receive counts are; the others
//                   read them, in this process);
//   reduce_scatter  block (me) of every input, reduced in rank order (then
//                   AVG's division); every rank reduces its own block, so the
//                   results are the bits the message algorithms give.
//   done = k.
// Step 4 (finish): return once every rank is done: until then the others
//   read this rank's input.

#include "fabric/direct_shm.hpp"

#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "actors/call.hpp"
#include "algorithms/algorithm.hpp"
#include "fabric/medium.hpp"
#include "fabric/shm_op.hpp"
#include "src/reduce_kernels.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {
namespace {

/// FNV-1a over the counts: ranks that disagree on them disagree on this.
std::uint64_t hash_counts(const std::vector<std::int64_t>& counts) {
  std::uint64_t h = 1469598103934665603ull;
  for (auto c : counts) {
    auto v = static_cast<std::uint64_t>(c);
    for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ull;
  }
  return h;
}

bool rooted(op_code c) {
  return c == op_code::broadcast || c == op_code::gatherv || c == op_code::scatterv;
}

class direct_shm final : public shm_op {
 public:
  explicit direct_shm(collective_call call)
      : shm_op(static_cast<std::uint8_t>(call.code)),
        call_(std::make_unique<collective_call>(std::move(call))) {}

  bool step(fabric_context& ctx, bool& moved) override {
    auto& c = *call_;
    switch (phase_) {
      case phase::post: {
        if (!all_reached(ctx, &rank_progress::done, op >= 2 ? op - 2 : 0,
                         "finish its previous operation"))
          return false;
        auto& d = ctx.seg->descriptor(ctx.rank, op);
        d = op_descriptor{};
        d.op = op;
        d.seq = seq;
        d.nbytes = c.input.defined() ? c.input.nbytes() : 0;
        d.dtype = static_cast<std::uint32_t>(element_type().scalar_type());
        d.reduce = static_cast<std::uint32_t>(c.op.op());
        d.code = code_;
        d.root = rooted(c.code) ? c.root : 0;
        d.addr = c.input.defined() ? reinterpret_cast<std::uint64_t>(c.input.data()) : 0;
        if (c.code == op_code::alltoallv) {
          // Each rank's own send and receive counts, read by the others.
          d.counts_addr = reinterpret_cast<std::uint64_t>(c.counts.data());
          d.recv_counts_addr = reinterpret_cast<std::uint64_t>(c.recv_counts.data());
        } else {
          d.counts_hash = hash_counts(c.counts);
        }
        publish(ctx, &rank_progress::arrived, op, moved);
        phase_ = phase::agree;
        [[fallthrough]];
      }
      case phase::agree:
        if (!all_reached(ctx, &rank_progress::arrived, op, "issue this " + name, true))
          return false;
        check(ctx, moved);
        if (refused_.empty()) pull(ctx);
        finish_op(ctx, moved);
        phase_ = phase::finish;
        [[fallthrough]];
      case phase::finish:
        // Until every rank is done the others read this rank's input (and,
        // while they check, its counts): a refusing rank waits too.
        if (!all_reached(ctx, &rank_progress::done, op, "finish reading this rank's input"))
          return false;
        // Every rank checked the same arguments: all refuse alike, and step past.
        if (!refused_.empty())
          throw error(
              errc::invalid_argument,
              name + ": " + refused_ + " (do the ranks pass the same arguments and tensors?)");
        if (c.on_success) c.on_success();
        return true;
    }
    return false;
  }

 private:
  enum class phase { post, agree, finish };

  /// The tensor whose dtype the call moves (gather's non-roots have no output).
  const tensor& element_type() const {
    return call_->input.defined() ? call_->input : call_->output;
  }
  std::int64_t element_bytes() const {
    return static_cast<std::int64_t>(element_size(element_type().scalar_type()));
  }

  /// The bytes rank r's input must hold, or -1 when any size will do.
  std::int64_t expected_input(int r, int root) const {
    const auto& k = call_->counts;
    const auto total = std::accumulate(k.begin(), k.end(), std::int64_t{0});
    switch (call_->code) {
      case op_code::broadcast:
        return -1;  // compared with the root's below
      case op_code::allgatherv:
      case op_code::gatherv:
        return k[static_cast<std::size_t>(r)] * element_bytes();
      case op_code::scatterv:
        return r == root ? total * element_bytes() : -1;
      case op_code::reduce_scatterv:
        return total * element_bytes();
      default:
        return -1;
    }
  }

  /// Remembers the first disagreement (thrown once every rank is done).
  void refuse(const std::string& why) {
    if (refused_.empty()) refused_ = why;
  }

  void check(fabric_context& ctx, bool& moved) {
    const auto& mine = ctx.seg->descriptor(ctx.rank, op);
    const int root = static_cast<int>(mine.root);
    auto who = [&](int r) { return ctx.names[static_cast<std::size_t>(r)]; };
    for (int r = 0; r < ctx.size; ++r) {
      check_code(ctx, r, moved);
      const auto& d = ctx.seg->descriptor(r, op);
      if (d.dtype != mine.dtype)
        refuse(who(r) + " passed " + std::string(to_string(static_cast<dtype>(d.dtype))) +
               ", this rank " + std::string(to_string(static_cast<dtype>(mine.dtype))));
      if (d.root != mine.root)
        refuse(who(r) + " passed root " + std::to_string(d.root) + ", this rank root " +
               std::to_string(mine.root));
      if (d.reduce != mine.reduce)
        refuse(who(r) + " passed " + to_string(static_cast<reduce_op::kind>(d.reduce)) +
               ", this rank " + to_string(static_cast<reduce_op::kind>(mine.reduce)));
      if (d.counts_hash != mine.counts_hash)
        refuse(who(r) + " passed other counts (sizes per rank) than this rank");
    }
    if (call_->code == op_code::alltoallv) return check_alltoall(ctx);
    // The counts agree, so every rank checks the sizes against the same numbers.
    const auto& root_d = ctx.seg->descriptor(root, op);
    for (int r = 0; r < ctx.size; ++r) {
      const auto& d = ctx.seg->descriptor(r, op);
      auto want = expected_input(r, root);
      if (call_->code == op_code::broadcast) want = static_cast<std::int64_t>(root_d.nbytes);
      if (want >= 0 && static_cast<std::int64_t>(d.nbytes) != want)
        refuse(who(r) + " passed " + std::to_string(d.nbytes) + " bytes of " +
               std::string(to_string(static_cast<dtype>(d.dtype))) + ", this rank expected " +
               std::to_string(want) + " from it");
    }
  }

  /// Rank r's send counts (alltoall), or its receive counts.
  const std::int64_t* counts_of(fabric_context& ctx, int r, bool receive) const {
    const auto& d = ctx.seg->descriptor(r, op);
    return reinterpret_cast<const std::int64_t*>(receive ? d.recv_counts_addr : d.counts_addr);
  }

  /// Every rank checks every pair, so all refuse alike.
  void check_alltoall(fabric_context& ctx) {
    auto who = [&](int r) { return ctx.names[static_cast<std::size_t>(r)]; };
    for (int r = 0; r < ctx.size; ++r) {
      const auto* sends = counts_of(ctx, r, false);
      std::int64_t total = 0;
      for (int q = 0; q < ctx.size; ++q) {
        total += sends[q];
        const auto expected = counts_of(ctx, q, true)[r];
        if (sends[q] != expected)
          refuse(who(r) + " sends " + std::to_string(sends[q]) + " elements to " + who(q) +
                 ", which expects " + std::to_string(expected) + " from it");
      }
      const auto bytes = ctx.seg->descriptor(r, op).nbytes;
      if (static_cast<std::int64_t>(bytes) != total * element_bytes())
        refuse(who(r) + " passed an input of " + std::to_string(bytes) + " bytes for " +
               std::to_string(total) + " elements");
    }
  }

  /// Rank r's input in this process.
  const std::byte* input_of(fabric_context& ctx, int r) const {
    return reinterpret_cast<const std::byte*>(ctx.seg->descriptor(r, op).addr);
  }

  void pull(fabric_context& ctx) {
    auto& c = *call_;
    const int me = ctx.rank, n = ctx.size, root = rooted(c.code) ? c.root : 0;
    const auto es = element_bytes();
    const auto offsets = offsets_of(c.counts);
    auto* out = c.output.defined() ? static_cast<std::byte*>(c.output.data()) : nullptr;
    auto at = [&](int r) { return offsets[static_cast<std::size_t>(r)] * es; };
    auto bytes = [&](int r) { return c.counts[static_cast<std::size_t>(r)] * es; };
    // Copies unless source and destination are the same memory (in place).
    auto move = [&](std::byte* dst, const std::byte* src, std::int64_t n_bytes) {
      if (dst != src) copy(dst, src, n_bytes);
    };
    switch (c.code) {
      case op_code::broadcast:
        if (me != root)
          move(out, input_of(ctx, root), static_cast<std::int64_t>(c.output.nbytes()));
        break;
      case op_code::allgatherv:
      case op_code::gatherv:
        if (c.code == op_code::gatherv && me != root) break;
        for (int r = 0; r < n; ++r) move(out + at(r), input_of(ctx, r), bytes(r));
        break;
      case op_code::scatterv:
        move(out, input_of(ctx, root) + at(me), bytes(me));
        break;
      case op_code::alltoallv: {
        const auto* recv = c.recv_counts.data();
        std::int64_t at_out = 0;
        for (int r = 0; r < n; ++r) {
          const auto* sends = counts_of(ctx, r, false);
          const auto at_in = std::accumulate(sends, sends + me, std::int64_t{0});
          move(out + at_out * es, input_of(ctx, r) + at_in * es, recv[r] * es);
          at_out += recv[r];
        }
        break;
      }
      case op_code::reduce_scatterv: {
        std::vector<const void*> srcs(static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) srcs[static_cast<std::size_t>(r)] = input_of(ctx, r) + at(me);
        const auto kind = c.op.op() == reduce_op::AVG ? reduce_op::SUM : c.op.op();
        const auto count = c.counts[static_cast<std::size_t>(me)];
        // In place (the output is block me of this rank's input) the
        // destination is also a source; elementwise, that is safe.
        reduce_many(c.output.scalar_type(), kind, out, srcs.data(), srcs.size(),
                    static_cast<std::size_t>(count));
        finish_reduction(c, c.output, n);
        reduced_bytes_ += static_cast<std::uint64_t>(count * es * n);
        break;
      }
      default:
        throw error(errc::internal, name + ": no direct path for this collective");
    }
  }

  std::unique_ptr<collective_call> call_;
  phase phase_ = phase::post;
  std::string refused_;
};

}  // namespace

bool fits_direct_shm(const collective_call& c) {
  switch (c.code) {
    case op_code::broadcast:
    case op_code::allgatherv:
    case op_code::gatherv:
    case op_code::scatterv:
    case op_code::alltoallv:
      return true;
    case op_code::reduce_scatterv:
      // PREMUL_SUM scales every input before the sum: the message algorithms'.
      return c.op.op() != reduce_op::PREMUL_SUM;
    default:
      return false;
  }
}

std::unique_ptr<fabric_op> make_direct_shm(collective_call call) {
  return std::make_unique<direct_shm>(std::move(call));
}

}  // namespace troupe::detail
