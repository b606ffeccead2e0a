// direct_shm — broadcast, allgather, gather, scatter, reduce_scatter and alltoall among
// the ranks of one host through the group's segment. Ranks of one process
// (and, for alltoall, reduce_scatter, gather and scatter, ranks of several processes whose
// inputs peers can map: tensor::empty buffers of 64 KiB and more from their
// second use, tensor::empty_shared) go straight between their buffers: each
// rank copies (reduce_scatter: reduces) what its own output needs from the
// others' inputs, so every byte is copied once, by the rank that needs it,
// with no message, staging buffer or thread in between. Otherwise the
// sources are staged chunk by chunk through the segment's slots (below).
// A gather's root with an output of 64 KiB or more offers it instead (in
// its descriptor; shared in place between processes): every other rank
// writes its block there and returns, while the root copies its own.
//
// Calls of even blocks whose sources fit the tiny lane, which host_backend
// builds without a planned call, run as tiny_direct instead
// (inline/shm/tiny_direct.cpp): it posts there what this operation posts.
//
// Terms: k is the inline operation number; "counts" the elements per rank
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
// Step 3 (pull), into this rank's output only: what the collective's layout
//   (inline/shm/direct_layout.hpp, one file per collective) says this rank
//   needs of every rank's input, copied (reduce_scatter: reduced in rank
//   order, then AVG's division; every rank reduces its own block, so the
//   results are the bits the message algorithms give); done = k.
// Step 4 (finish): return once every rank is done: until then the others
//   read this rank's input.

// How it runs once every rank posted (select; the same on every rank):
//   every source fits the tiny lane                  tiny (posted there instead)
//   the arguments disagree                           refused (every rank alike)
//   a gather whose root offered its output           into_root (push)
//   every source fits a small slot (not alltoall)    from_slots (or in place where shared)
//   ranks of several processes, a source private     staged
//   else (one process, or every source shared)       pull

#include "inline/shm/direct_shm.hpp"

#include "inline/medium.hpp"
#include "inline/shm/direct_shm_op.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

bool direct_shm::step(inline_context& ctx, bool& moved) {
  switch (phase_) {
    case phase::post:
      if (!to_slots_ && all_tiny(ctx)) {
        if (!tiny_lane_free(ctx)) return false;
        post_on_tiny_lane(ctx, moved);
        phase_ = phase::tiny;
        return step_tiny(ctx, moved);
      }
      if (!post(ctx, moved)) return false;
      phase_ = phase::agree;
      [[fallthrough]];
    case phase::agree:
      if (!all_reached(ctx, &rank_progress::arrived, op, "issue this ", true)) return false;
      check(ctx, moved);
      return run(select(ctx), ctx, moved);
    case phase::finish:
      // Until every rank is done the others read this rank's input (and,
      // while they check, its counts): a refusing rank waits too.
      if (!all_reached(ctx, &rank_progress::done, op, "finish reading this rank's input"))
        return false;
      // Every rank checked the same arguments: all refuse alike, and step past.
      if (!refused_.empty()) throw disagreement_error(refused_);
      if (call_.on_success) call_.on_success();
      return true;
    case phase::staged:
      return run_staged(ctx, moved);
    case phase::tiny:
      return step_tiny(ctx, moved);
  }
  return false;
}

direct_shm::how direct_shm::select(inline_context& ctx) const {
  if (!refused_.empty()) return how::refused;
  if (root_offered_output(ctx)) return how::into_root;
  if (all_small(ctx)) return how::from_slots;
  if (!ctx.one_process && !sources_shared(ctx)) return how::staged;
  return how::pull;
}

bool direct_shm::run(how h, inline_context& ctx, bool& moved) {
  auto& c = call_;
  switch (h) {
    case how::into_root:
      // Each rank writes its block into the root's output; the root
      // returns once all did (their done), the others at once.
      push(ctx);
      finish_op(ctx, moved);
      if (ctx.rank == c.root) {
        phase_ = phase::finish;
        return step(ctx, moved);
      }
      if (c.on_success) c.on_success();
      return true;
    case how::from_slots:
      // Each source from its slot, or in place where it is shared.
      own_part(ctx);
      consume_range(ctx, 0, small_limit(ctx), [&](int r) {
        return read_in_place(ctx, r) ? input_of(ctx, r)
                                     : static_cast<const std::byte*>(ctx.seg->small_slot(r, op));
      });
      finish_op(ctx, moved);
      // The slots are reused at operation k+2, once every rank is done
      // with this one: no rank waits for the others here, unless they
      // read its input in place.
      if (read_in_place(ctx, ctx.rank) && read_by_others(ctx, ctx.rank)) {
        phase_ = phase::finish;
        return step(ctx, moved);
      }
      if (c.on_success) c.on_success();
      return true;
    case how::staged:
      start_staged(ctx);
      phase_ = phase::staged;
      return run_staged(ctx, moved);
    case how::pull:
      pull(ctx);
      break;
    case how::refused:
      break;
  }
  finish_op(ctx, moved);
  phase_ = phase::finish;
  return step(ctx, moved);
}

bool direct_shm::post(inline_context& ctx, bool& moved) {
  auto& c = call_;
  if (!all_reached(ctx, &rank_progress::done, op >= 2 ? op - 2 : 0,
                   "finish its previous operation"))
    return false;
  // Outputs larger than the caches together go out streaming, except
  // a broadcast's between processes, where streaming stores are slower:
  // its readers copy from slots one root fills.
  stream_output_ = outgrows_cache(c.output.defined() ? c.output.nbytes() : 0, ctx.size) &&
                   !(c.code == op_code::broadcast && !ctx.one_process);
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
    // Each rank's own send and receive counts, read by the others, and
    // whether they are even (splits_mark): ranks whose marks are alike
    // agree without reading each other's counts.
    auto* slot = ctx.seg->counts(ctx.rank, op);
    std::copy(c.counts.begin(), c.counts.end(), slot);
    std::copy(c.recv_counts.begin(), c.recv_counts.end(), slot + ctx.size);
    const auto first = c.counts.empty() ? 0 : c.counts.front();
    auto is_first = [&](std::int64_t k) { return k == first; };
    const bool even = std::all_of(c.counts.begin(), c.counts.end(), is_first) &&
                      std::all_of(c.recv_counts.begin(), c.recv_counts.end(), is_first) &&
                      static_cast<std::int64_t>(d.nbytes) == ctx.size * first * element_bytes();
    d.counts_hash = splits_mark(even, first);
  } else {
    d.counts_hash = hash_counts(c.counts);
  }
  // Inputs that peers can map (64 KiB and more: a buffer of its own)
  // are read in place between processes.
  // (alltoall's counts of the others are not posted yet: any source.)
  if (ctx.peers && pulls_between_processes() && c.input.defined() &&
      c.input.nbytes() >= own_mapping_bytes &&
      (c.code == op_code::alltoallv ? source_bytes(ctx, ctx.rank) > 0
                                    : read_by_others(ctx, ctx.rank)))
    describe_shared(d, c.input);
  // A gather's root offers its output to the others' writes (its own
  // input nobody reads, so the share fields are free).
  if (offers_output(ctx)) {
    if (ctx.one_process) {
      d.out_addr = reinterpret_cast<std::uint64_t>(c.output.data());
      d.out_nbytes = c.output.nbytes();
    } else if (d.share_id == 0) {
      describe_shared(d, c.output);
      if (d.share_id != 0) d.out_nbytes = c.output.nbytes();
    }
  }
  // Other small sources travel in the descriptor's slot: one step
  // (not alltoall's: its slot holds the counts).
  if (const auto mine = source_bytes(ctx, ctx.rank); c.code != op_code::alltoallv &&
                                                     mine <= small_limit(ctx) && mine > 0 &&
                                                     !read_in_place(ctx, ctx.rank))
    copy(ctx.seg->small_slot(ctx.rank, op), static_cast<const std::byte*>(c.input.data()), mine);
  publish(ctx, &rank_progress::arrived, op, moved);
  // What this rank's output needs of its own input is copied while
  // the others post (a gather's root copied its own block only once
  // every rank had arrived). It writes only what nobody reads (as
  // own_part always did); should the calls disagree, the call fails
  // and its output is not defined.
  own_part(ctx);
  return true;
}

void direct_shm::check(inline_context& ctx, bool& moved) {
  // What every rank called (collective, dtype, root, op, counts, splits).
  auto why = disagreement(ctx);
  if (why.empty() && call_.code == op_code::alltoallv) {
    const auto mark = ctx.seg->descriptor(ctx.rank, op).counts_hash;
    bool alike = mark != 0;
    for (int r = 0; r < ctx.size && alike; ++r)
      alike = ctx.seg->descriptor(r, op).counts_hash == mark;
    if (alike) even_ = static_cast<std::int64_t>(mark) - 1;
  }
  if (!why.empty()) {
    refuse(why);
    // Another collective: its protocol on this segment differs; done here.
    if (ctx.seg->descriptor(ctx.rank, op).code != code_ || !same_codes(ctx)) {
      finish_op(ctx, moved);
      throw disagreement_error(refused_);
    }
    return;
  }
  // The calls agree, so every rank checks the sizes against the same numbers.
  if (auto why = wrong_input(ctx, [&](int r) { return ctx.seg->descriptor(r, op).nbytes; });
      !why.empty())
    refuse(why);
}

const direct_layout& direct_shm::layout_for(op_code c) {
  switch (c) {
    case op_code::broadcast:
      return make_direct_broadcast();
    case op_code::allgatherv:
      return make_direct_gather(true);
    case op_code::gatherv:
      return make_direct_gather(false);
    case op_code::scatterv:
      return make_direct_scatter();
    case op_code::reduce_scatterv:
      return make_direct_reduce_scatter();
    case op_code::alltoallv:
      return make_direct_alltoall();
    default:
      throw error(errc::internal, std::string("direct_shm: no layout for ") + to_string(c));
  }
}

bool fits_direct_shm(const collective_call& c, int size) {
  switch (c.code) {
    case op_code::broadcast:
    case op_code::allgatherv:
    case op_code::gatherv:
    case op_code::scatterv:
      return true;
    case op_code::alltoallv:  // its counts have their own region (segment.hpp)
      (void)size;
      return true;
    case op_code::reduce_scatterv:
      // PREMUL_SUM scales every input before the sum: the message algorithms'.
      return c.op.op() != reduce_op::PREMUL_SUM;
    default:
      return false;
  }
}

std::unique_ptr<inline_op> make_direct_shm(collective_call&& call) {
  return std::make_unique<direct_shm>(std::move(call));
}

std::unique_ptr<inline_op> make_direct_shm_in_slots(collective_call&& call) {
  auto op = std::make_unique<direct_shm>(std::move(call));
  op->move_to_slots();
  return op;
}

}  // namespace troupe::detail
