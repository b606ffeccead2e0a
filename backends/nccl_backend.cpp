// The "nccl" backend (c10d's ProcessGroupNCCL) for cuda tensors: each call
// becomes a plan (backends/nccl_plan.hpp) that a plan_runner (backends/nccl_runner.hpp)
// issues: the group's NCCL state (backends/nccl_group.hpp, which holds the design:
// communicators, set-up, launching, failures), or in tests an emulator of
// NCCL on host memory (tests/test_nccl_mapping.cpp). Dtypes and reductions:
// backends/nccl_plan.hpp.
//
// Mapping (one helper per pattern: NCCL collectives on flat buffers, grouped
// send/recv, pack/unpack with gpu::copy_segments)
//   broadcast                  ncclBroadcast in place; copies into the other local tensors
//   allreduce, reduce          ncclAllReduce / ncclReduce in place; several local tensors:
//                              gpu::reduce into one, NCCL, gpu::reduce into the outputs
//   allreduce_coalesced        grouped ncclAllReduce, one per tensor
//   allgather(_coalesced)      grouped ncclAllGather into flat buffers, unpacked
//   allgather_into_tensor(_coalesced)    (grouped) ncclAllGather into the outputs
//   allgatherv                 grouped ncclBroadcast: root r sends block r
//   gather(v), scatter(v)      grouped ncclSend/ncclRecv with the root
//   alltoall(_single)          grouped ncclSend/ncclRecv with every rank
//   reduce_scatter             inputs packed into one buffer, ncclReduceScatter
//   reduce_scatter_tensor(_coalesced)    (grouped) ncclReduceScatter
//   reduce_scatterv            grouped ncclReduce: root r receives block r
//   barrier                    ncclAllReduce of one byte on the group's device (or device_ids[0])
//   send, recv                 ncclSend / ncclRecv on the pair's communicator (tags ignored)
//   recv_any_source, monitored_barrier   not supported (backend::unsupported)

#include "backends/nccl_backend.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/nccl_group.hpp"
#include "backends/nccl_plan.hpp"
#include "backends/nccl_runner.hpp"
#include "base/tensor_util.hpp"

namespace troupe::detail {

namespace nccl {

namespace {

// -- plan building ------------------------------------------------------------------

std::size_t numel(const tensor& t) {
  return static_cast<std::size_t>(t.numel());
}

/// Address of element `i` of `t`.
char* at(const tensor& t, std::size_t i) {
  return static_cast<char*>(t.data()) + i * t.element_size();
}

collective on(collective::kind_t k, const tensor& send, const tensor& recv, std::size_t n,
              reduction red = {}, int root = 0) {
  return {k, send.data(), recv.data(), n, send.scalar_type(), red, root};
}

/// Copies `n` elements of `src` from `src_at` into `dst` at `dst_at`.
gpu::copy_segment segment(const tensor& dst, std::size_t dst_at, const tensor& src,
                          std::size_t src_at, std::size_t n) {
  return {at(dst, dst_at), at(src, src_at), n * src.element_size()};
}

/// Adds a send (or receive) of `n` elements of `t` from element `i` to `peer`.
void exchange(plan& p, bool send, const tensor& t, std::size_t i, std::size_t n, int peer) {
  if (n > 0) p.transfers.push_back({send, at(t, i), n, t.scalar_type(), peer});
}

/// Where each rank's block starts, for counts in elements.
std::vector<std::size_t> starts(const std::vector<std::int64_t>& counts) {
  std::vector<std::size_t> r;
  std::size_t off = 0;
  for (auto c : counts) {
    r.push_back(off);
    off += static_cast<std::size_t>(c);
  }
  return r;
}

tensor_list flatten(const std::vector<tensor_list>& lists) {
  tensor_list r;
  for (auto& l : lists) r.insert(r.end(), l.begin(), l.end());
  return r;
}

tensor_list both(const tensor_list& a, const tensor_list& b) {
  tensor_list r = a;
  r.insert(r.end(), b.begin(), b.end());
  return r;
}

/// A plan that keeps `ts` (inputs that are not outputs) alive.
plan keeping(const tensor_list& ts) {
  plan p;
  p.keep = ts;
  return p;
}

// -- the backend: each call's plan -----------------------------------------------------

class nccl_backend final : public backend {
 public:
  nccl_backend(const backend_context& ctx, std::shared_ptr<plan_runner> runner)
      : backend(ctx), g_(std::move(runner)) {}
  ~nccl_backend() override { g_->shutdown(); }

  std::string name() const override { return "nccl"; }

  work broadcast(tensor_list& ts, const broadcast_options& o) override {
    const char* op = "broadcast";
    prepare(op, ts);
    const auto& src = ts[static_cast<std::size_t>(rank() == o.root_rank ? o.root_tensor : 0)];
    plan p;
    p.collectives.push_back(on(collective::broadcast, src, src, numel(src), {}, o.root_rank));
    for (auto& t : ts)
      if (!t.is_same(src)) p.unpack.push_back(segment(t, 0, src, 0, numel(src)));
    return g_->issue(op, whole_group, std::move(p), ts, o.timeout);
  }

  work allreduce(tensor_list& ts, const allreduce_options& o) override {
    return reducing("allreduce", collective::allreduce, ts, o.op, 0, 0, o.timeout);
  }

  work allreduce_coalesced(tensor_list& ts, const allreduce_coalesced_options& o) override {
    return paired("allreduce_coalesced", collective::allreduce, ts, ts, o.op, o.timeout);
  }

  work reduce(tensor_list& ts, const reduce_options& o) override {
    return reducing("reduce", collective::reduce, ts, o.op, o.root_rank, o.root_tensor, o.timeout);
  }

  work allgather(std::vector<tensor_list>& outs, tensor_list& ins,
                 const allgather_options& o) override {
    // outs[i][r] <- rank r's ins[i]
    return gathered("allgather", outs, ins, o.timeout,
                    [&](std::size_t i, std::size_t r) -> const tensor& { return outs[i][r]; });
  }

  work allgather_coalesced(std::vector<tensor_list>& outs, tensor_list& ins,
                           const allgather_options& o) override {
    // outs[r][i] <- rank r's ins[i]
    return gathered("allgather_coalesced", outs, ins, o.timeout,
                    [&](std::size_t i, std::size_t r) -> const tensor& { return outs[r][i]; });
  }

  work allgather_into_tensor(tensor& out, tensor& in, const allgather_options& o) override {
    tensor_list outs{out}, ins{in};
    return paired("allgather_into_tensor", collective::allgather, outs, ins, {}, o.timeout);
  }

  work allgather_into_tensor_coalesced(tensor_list& outs, tensor_list& ins,
                                       const allgather_options& o) override {
    return paired("allgather_into_tensor_coalesced", collective::allgather, outs, ins, {},
                  o.timeout);
  }

  work allgatherv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
                  const allgather_options& o) override {
    // Rank r broadcasts its block into everyone's output.
    const char* op = "allgatherv";
    prepare(op, {out, in});
    auto p = keeping({in});
    const auto off = starts(counts);
    for (int r = 0; r < size(); ++r) {
      auto block = at(out, off[rank_index(r)]);
      const void* send = r == rank() ? in.data() : block;  // only the root's is read
      p.collectives.push_back(
          {collective::broadcast, send, block, count_of(counts, r), out.scalar_type(), {}, r});
    }
    return g_->issue(op, whole_group, std::move(p), {out}, o.timeout);
  }

  work gather(std::vector<tensor_list>& outs, tensor_list& ins, const gather_options& o) override {
    const char* op = "gather";
    auto all = flatten(outs);
    prepare(op, both(ins, all));
    auto p = keeping(ins);
    const auto m = numel(ins[0]);
    exchange(p, true, ins[0], 0, m, o.root_rank);
    if (rank() == o.root_rank)
      for (int r = 0; r < size(); ++r) exchange(p, false, outs[0][rank_index(r)], 0, m, r);
    return g_->issue(op, whole_group, std::move(p), all, o.timeout);
  }

  work gatherv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
               const gather_options& o) override {
    // The output matters on the root only.
    const char* op = "gatherv";
    const bool root = rank() == o.root_rank;
    tensor_list ts = root ? tensor_list{out, in} : tensor_list{in};
    prepare(op, ts);
    auto p = keeping({in});
    exchange(p, true, in, 0, count_of(counts, rank()), o.root_rank);
    const auto off = starts(counts);
    if (root)
      for (int r = 0; r < size(); ++r)
        exchange(p, false, out, off[rank_index(r)], count_of(counts, r), r);
    return g_->issue(op, whole_group, std::move(p), {out}, o.timeout);
  }

  work scatter(tensor_list& outs, std::vector<tensor_list>& ins,
               const scatter_options& o) override {
    const char* op = "scatter";
    auto all = flatten(ins);
    prepare(op, both(outs, all));
    auto p = keeping(all);
    const auto m = numel(outs[0]);
    if (rank() == o.root_rank)
      for (int r = 0; r < size(); ++r) exchange(p, true, ins[0][rank_index(r)], 0, m, r);
    exchange(p, false, outs[0], 0, m, o.root_rank);
    return g_->issue(op, whole_group, std::move(p), outs, o.timeout);
  }

  work scatterv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
                const scatter_options& o) override {
    const char* op = "scatterv";
    const bool root = rank() == o.root_rank;
    tensor_list ts = root ? tensor_list{out, in} : tensor_list{out};
    prepare(op, ts);
    auto p = keeping(ts);
    const auto off = starts(counts);
    if (root)
      for (int r = 0; r < size(); ++r)
        exchange(p, true, in, off[rank_index(r)], count_of(counts, r), r);
    exchange(p, false, out, 0, count_of(counts, rank()), o.root_rank);
    return g_->issue(op, whole_group, std::move(p), {out}, o.timeout);
  }

  work reduce_scatter(tensor_list& outs, std::vector<tensor_list>& ins,
                      const reduce_scatter_options& o) override {
    // The inputs (one per rank) are packed into one buffer first.
    const char* op = "reduce_scatter";
    auto& parts = ins[0];
    const int dev = prepare(op, both(outs, parts));
    const auto m = numel(outs[0]);
    auto buf = scratch(outs[0], m * static_cast<std::size_t>(size()), dev);
    auto p = keeping(parts);
    p.keep.push_back(buf);
    for (int r = 0; r < size(); ++r)
      p.pack.push_back(segment(buf, rank_index(r) * m, parts[rank_index(r)], 0, m));
    p.collectives.push_back(on(collective::reduce_scatter, buf, outs[0], m,
                               reduction_of(op, o.op, outs[0].scalar_type())));
    return g_->issue(op, whole_group, std::move(p), outs, o.timeout);
  }

  work reduce_scatter_tensor(tensor& out, tensor& in, const reduce_scatter_options& o) override {
    tensor_list outs{out}, ins{in};
    return paired("reduce_scatter_tensor", collective::reduce_scatter, outs, ins, o.op, o.timeout);
  }

  work reduce_scatter_tensor_coalesced(tensor_list& outs, tensor_list& ins,
                                       const reduce_scatter_options& o) override {
    return paired("reduce_scatter_tensor_coalesced", collective::reduce_scatter, outs, ins, o.op,
                  o.timeout);
  }

  work reduce_scatterv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
                       const reduce_scatter_options& o) override {
    // Every rank reduces block r into rank r's output.
    const char* op = "reduce_scatterv";
    prepare(op, {out, in});
    const auto red = reduction_of(op, o.op, in.scalar_type());
    auto p = keeping({in});
    const auto off = starts(counts);
    for (int r = 0; r < size(); ++r) {
      auto block = at(in, off[rank_index(r)]);
      void* recv = r == rank() ? out.data() : block;  // only the root's is written
      p.collectives.push_back(
          {collective::reduce, block, recv, count_of(counts, r), in.scalar_type(), red, r});
    }
    return g_->issue(op, whole_group, std::move(p), {out}, o.timeout);
  }

  work alltoall_single(tensor& out, tensor& in, const std::vector<std::int64_t>& out_splits,
                       const std::vector<std::int64_t>& in_splits,
                       const alltoall_options& o) override {
    const char* op = "alltoall_single";
    prepare(op, {out, in});
    const auto send = rows_to_elements(in, in_splits), recv = rows_to_elements(out, out_splits);
    const auto send_at = starts(send), recv_at = starts(recv);
    auto p = keeping({in});
    for (int r = 0; r < size(); ++r) {
      exchange(p, true, in, send_at[rank_index(r)], count_of(send, r), r);
      exchange(p, false, out, recv_at[rank_index(r)], count_of(recv, r), r);
    }
    return g_->issue(op, whole_group, std::move(p), {out}, o.timeout);
  }

  work alltoall(tensor_list& outs, tensor_list& ins, const alltoall_options& o) override {
    const char* op = "alltoall";
    prepare(op, both(outs, ins));
    auto p = keeping(ins);
    for (int r = 0; r < size(); ++r) {
      const auto& x = ins[rank_index(r)];
      const auto& y = outs[rank_index(r)];
      exchange(p, true, x, 0, numel(x), r);
      exchange(p, false, y, 0, numel(y), r);
    }
    return g_->issue(op, whole_group, std::move(p), outs, o.timeout);
  }

  work barrier(const barrier_options& o) override {
    // An allreduce of one byte, as ProcessGroupNCCL's barrier: on the first
    // of device_ids when given (bind refuses a device other than the one the
    // group's communicator lives on), else on the group's device.
    tensor one;
    if (o.device_ids.empty()) {
      one = g_->scratch(dtype::uint8, 1, g_->bind_default("barrier"));
    } else {
      one = g_->scratch(dtype::uint8, 1, static_cast<int>(o.device_ids.front()));
      g_->bind("barrier", {one});
    }
    auto p = keeping({one});
    p.collectives.push_back(on(collective::allreduce, one, one, 1));
    return g_->issue("barrier", whole_group, std::move(p), {}, o.timeout);
  }

  work send(tensor_list& ts, int dst, const p2p_options& o) override {
    return point_to_point("send", true, ts, dst, o);
  }

  work recv(tensor_list& ts, int src, const p2p_options& o) override {
    return point_to_point("recv", false, ts, src, o);
  }

  /// One NCCL group of sends and receives on the group's communicator (as
  /// ProcessGroupNCCL: if it is the group's first call, every rank makes one).
  work batch_isend_irecv(std::vector<p2p_op>& ops) override {
    const char* op = "batch_isend_irecv";
    tensor_list bufs;
    for (auto& o : ops) bufs.push_back(o.buffer);
    prepare(op, bufs);
    auto p = keeping(bufs);
    for (auto& o : ops) exchange(p, o.kind == p2p_op::isend, o.buffer, 0, numel(o.buffer), o.peer);
    return g_->issue(op, whole_group, std::move(p), bufs, use_group_timeout);
  }

  std::uint64_t sequence_number() override { return g_->sequence(); }

  void abort(const std::string& reason) override { g_->abort(reason); }

 private:
  /// Refuses dtypes without an NCCL type and tensors off the group's device; returns the device.
  int prepare(const char* op, const tensor_list& ts) {
    check_types(op, ts);
    return g_->bind(op, ts);
  }

  static std::size_t rank_index(int r) { return static_cast<std::size_t>(r); }

  /// `n` elements of `like`'s dtype on the group's device.
  tensor scratch(const tensor& like, std::size_t n, int device) const {
    return g_->scratch(like.scalar_type(), n, device);
  }

  static std::size_t count_of(const std::vector<std::int64_t>& counts, int r) {
    return static_cast<std::size_t>(counts[rank_index(r)]);
  }

  std::vector<std::int64_t> rows_to_elements(const tensor& t,
                                             const std::vector<std::int64_t>& splits) const {
    return split_elements(t, splits, size());
  }

  /// allreduce and reduce: in place on one tensor, or combined over several.
  work reducing(const char* op, collective::kind_t k, tensor_list& ts, const reduce_op& r, int root,
                int root_tensor, timeout_t t) {
    const int dev = prepare(op, ts);
    const auto red = reduction_of(op, r, ts[0].scalar_type());
    plan p;
    if (ts.size() == 1)
      p.collectives.push_back(on(k, ts[0], ts[0], numel(ts[0]), red, root));
    else
      p = combined(op, k, ts, r, root, root_tensor, dev);
    return g_->issue(op, whole_group, std::move(p), ts, t);
  }

  /// Several local tensors: gpu::reduce combines them into one buffer
  /// (scaled for PREMUL_SUM), NCCL reduces that buffer across ranks (SUM for
  /// AVG and PREMUL_SUM), and gpu::reduce writes the result, divided by
  /// size × tensors for AVG, into every tensor (allreduce) or the root tensor (reduce).
  plan combined(const char* op, collective::kind_t k, const tensor_list& ts, const reduce_op& r,
                int root, int root_tensor, int dev) const {
    const auto t = ts[0].scalar_type();
    const auto n = numel(ts[0]);
    const bool avg = r.op() == reduce_op::AVG, premul = r.op() == reduce_op::PREMUL_SUM;
    plan p;
    // allreduce reduces into the first tensor; reduce into scratch, so that
    // the tensors of ranks other than the root stay as they were.
    auto buf = k == collective::allreduce ? ts[0] : scratch(ts[0], n, dev);
    p.keep.push_back(buf);
    gpu::reduce_args in{t, avg || premul ? reduce_op::SUM : r.op(), n, {}, {}, {buf.data()}, 0.0};
    for (auto& x : ts) in.srcs.push_back(x.data());
    if (premul) in.scales.assign(ts.size(), r.scale());
    p.combine.push_back(in);
    const auto across =
        avg || premul ? reduction_of(op, reduce_op::SUM, t) : reduction_of(op, r, t);
    p.collectives.push_back(on(k, buf, buf, n, across, root));
    const double divisor = avg ? static_cast<double>(size()) * static_cast<double>(ts.size()) : 0.0;
    gpu::reduce_args out{t, reduce_op::SUM, n, {buf.data()}, {}, {}, divisor};
    if (k == collective::allreduce)
      for (auto& x : ts) out.dsts.push_back(x.data());
    else if (rank() == root)
      out.dsts.push_back(ts[static_cast<std::size_t>(root_tensor)].data());
    if (!out.dsts.empty()) p.spread.push_back(out);
    return p;
  }

  /// One NCCL collective per (input, output) pair, in one group (`r`: the
  /// reduction, for reducing kinds).
  work paired(const char* op, collective::kind_t k, tensor_list& outs, tensor_list& ins,
              const std::optional<reduce_op>& r, timeout_t t) {
    prepare(op, both(outs, ins));
    auto p = keeping(ins);
    for (std::size_t i = 0; i < ins.size(); ++i) {
      const auto n = k == collective::allgather ? numel(ins[i]) : numel(outs[i]);
      const auto red = r ? reduction_of(op, *r, ins[i].scalar_type()) : reduction{};
      p.collectives.push_back(on(k, ins[i], outs[i], n, red));
    }
    return g_->issue(op, whole_group, std::move(p), outs, t);
  }

  /// allgather into flat buffers (one per input), unpacked into out(i, r).
  template <class Out>
  work gathered(const char* op, std::vector<tensor_list>& outs, tensor_list& ins, timeout_t t,
                Out out) {
    auto all = flatten(outs);
    const int dev = prepare(op, both(ins, all));
    const auto n = static_cast<std::size_t>(size());
    auto p = keeping(ins);
    for (std::size_t i = 0; i < ins.size(); ++i) {
      const auto m = numel(ins[i]);
      auto buf = scratch(ins[i], m * n, dev);
      p.keep.push_back(buf);
      p.collectives.push_back(on(collective::allgather, ins[i], buf, m));
      for (std::size_t r = 0; r < n; ++r) p.unpack.push_back(segment(out(i, r), 0, buf, r * m, m));
    }
    return g_->issue(op, whole_group, std::move(p), all, t);
  }

  /// send and recv: one transfer on the pair's communicator (tags are ignored, as in NCCL).
  work point_to_point(const char* op, bool send, tensor_list& ts, int peer, const p2p_options& o) {
    prepare(op, ts);
    plan p;
    exchange(p, send, ts[0], 0, numel(ts[0]), peer < rank() ? 0 : 1);
    return g_->issue(op, peer, std::move(p), ts, o.timeout, send ? -1 : peer);
  }

  std::shared_ptr<plan_runner> g_;
};

}  // namespace

}  // namespace nccl

std::shared_ptr<backend> make_nccl_backend(const backend_context& ctx) {
  return make_nccl_backend(ctx, std::make_shared<nccl::nccl_group>(ctx));
}

std::shared_ptr<backend> make_nccl_backend(const backend_context& ctx,
                                           std::shared_ptr<nccl::plan_runner> runner) {
  return std::make_shared<nccl::nccl_backend>(ctx, std::move(runner));
}

}  // namespace troupe::detail
