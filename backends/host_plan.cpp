// host_backend (host_backend.hpp): each c10d call planned onto one of the
// algorithm families (base/call.hpp) over flat buffers: several tensors
// packed into one, outputs unpacked when the call succeeds.

#include "backends/host_backend.hpp"

#include <algorithm>

#include "algorithms/algorithm.hpp"
#include "backends/cuda_staging.hpp"
#include "backends/flat_buffers.hpp"
#include "backends/mixed_blocks.hpp"
#include "base/tensor_util.hpp"
#include "base/work_state.hpp"
#include "inline/shm/tiny_direct.hpp"
#include "kernels/reduce_kernels.hpp"

namespace troupe::detail {

work host_backend::broadcast(tensor_list& ts, const broadcast_options& o) {
  if (ts.size() == 1) return broadcast_one(ts[0], o);
  auto c = make_call(op_code::broadcast, "broadcast", o.timeout, ts);
  c.root = o.root_rank;
  auto buf = flat(ts[static_cast<std::size_t>(rank() == o.root_rank ? o.root_tensor : 0)]);
  c.on_success = [buf, ts] {
    for (auto& t : ts)
      if (!flat(t).is_same(buf)) flat(t).copy_from(buf);
  };
  c.output = buf;
  c.input = std::move(buf);
  return submit(std::move(c));
}

work host_backend::broadcast_one(tensor& t, const broadcast_options& o) {
  // Ranks of one host, blocks the tiny lane holds: straight onto it,
  // without a planned call (the post direct_shm makes there).
  if (on_tiny_lane(op_code::broadcast, t, {}, {})) {
    tensor view;
    const auto& data = flat_ref(t, view);
    return on_tiny({op_code::broadcast, &data, &data, o.root_rank}, "broadcast", o.timeout, t, {});
  }
  auto c = make_call(op_code::broadcast, "broadcast", o.timeout, t);
  c.root = o.root_rank;
  c.input = c.output = flat(t);
  return submit(std::move(c));
}

work host_backend::allreduce(tensor_list& ts, const allreduce_options& o) {
  if (ts.size() == 1) return allreduce_one(ts[0], o);
  return reducing(op_code::allreduce, "allreduce", o.op, 0, 0, o.timeout, ts, false);
}

work host_backend::allreduce_one(tensor& t, const allreduce_options& o) {
  // The inline engine takes one CPU tensor and every op but PREMUL_SUM (its scale
  // may be a tensor). The choice depends only on what every rank passes alike.
  if (engine_ && t.get_device().type == device_type::cpu && o.op.op() != reduce_op::PREMUL_SUM)
    return allreduce_inline(t, o);
  return reducing_one(op_code::allreduce, "allreduce", o.op, 0, o.timeout, t);
}

work host_backend::allreduce_coalesced(tensor_list& ts, const allreduce_coalesced_options& o) {
  auto c = make_call(op_code::allreduce, "allreduce_coalesced", o.timeout, ts);
  c.op = o.op;
  c.input = c.output = pack(ts);
  c.on_success = [buf = c.output, ts] { unpack(buf, 0, ts); };
  return submit(std::move(c));
}

work host_backend::reduce(tensor_list& ts, const reduce_options& o) {
  if (ts.size() == 1) return reduce_one(ts[0], o);
  return reducing(op_code::reduce, "reduce", o.op, o.root_rank, o.root_tensor, o.timeout, ts, true);
}

work host_backend::reduce_one(tensor& t, const reduce_options& o) {
  // Ranks of one host: the shared-memory allreduce, writing the root's buffer alone.
  if (engine_ && shm_ && t.get_device().type == device_type::cpu &&
      o.op.op() != reduce_op::PREMUL_SUM)
    return on_segment(op_code::reduce, "reduce", t, o.op, o.root_rank, o.timeout);
  return reducing_one(op_code::reduce, "reduce", o.op, o.root_rank, o.timeout, t);
}

work host_backend::allgather(std::vector<tensor_list>& outs, tensor_list& ins,
                             const allgather_options& o) {
  // outs[i][r] <- rank r's ins[i]
  return gather_blocks(
      "allgather", o.timeout, ins,
      [outs](const tensor& all, int size) {
        std::int64_t off = 0;
        for (int r = 0; r < size; ++r)
          for (auto& per_input : outs) {
            auto& t = per_input[static_cast<std::size_t>(r)];
            flat(t).copy_from(all.flat_slice(off, t.numel()));
            off += t.numel();
          }
      },
      flatten(outs), ins.size() == 1 ? adjacent(outs[0]) : tensor{});
}

work host_backend::allgather_coalesced(std::vector<tensor_list>& outs, tensor_list& ins,
                                       const allgather_options& o) {
  // outs[r][i] <- rank r's ins[i]
  if (!one_dtype(ins))
    return gather_mixed(
        "allgather_coalesced", o.timeout, ins, flatten(outs),
        [outs](int r, std::size_t i) { return outs[static_cast<std::size_t>(r)][i]; });
  return gather_blocks(
      "allgather_coalesced", o.timeout, ins,
      [outs](const tensor& all, int) {
        std::int64_t off = 0;
        for (auto& per_rank : outs) off = unpack(all, off, per_rank);
      },
      flatten(outs), adjacent(flatten(outs)));
}

work host_backend::allgather_into_tensor_coalesced(tensor_list& outs, tensor_list& ins,
                                                   const allgather_options& o) {
  // outs[i] holds size blocks of ins[i]'s numel; the gathered buffer is rank-major.
  if (!one_dtype(ins))
    return gather_mixed("allgather_into_tensor_coalesced", o.timeout, ins, outs,
                        [outs, n = size()](int r, std::size_t i) {
                          const auto m = outs[i].numel() / n;  // ins[i]'s elements
                          return flat(outs[i]).flat_slice(r * m, m);
                        });
  return gather_blocks(
      "allgather_into_tensor_coalesced", o.timeout, ins,
      [outs, ins](const tensor& all, int size) {
        std::int64_t off = 0;
        for (int r = 0; r < size; ++r)
          for (std::size_t i = 0; i < ins.size(); ++i) {
            auto m = ins[i].numel();
            flat(outs[i]).flat_slice(r * m, m).copy_from(all.flat_slice(off, m));
            off += m;
          }
      },
      outs, ins.size() == 1 ? adjacent(outs) : tensor{});
}

work host_backend::allgather_into_tensor(tensor& out, tensor& in, const allgather_options& o) {
  if (on_tiny_lane(op_code::allgatherv, in, out, {})) {
    tensor views[2];
    return on_tiny({op_code::allgatherv, &flat_ref(in, views[0]), &flat_ref(out, views[1])},
                   "allgather_into_tensor", o.timeout, out, {});
  }
  auto c = make_call(op_code::allgatherv, "allgather_into_tensor", o.timeout, out);
  c.input = flat(in);
  c.output = flat(out);
  c.counts.assign(static_cast<std::size_t>(size()), in.numel());
  return submit(std::move(c));
}

work host_backend::allgatherv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
                              const allgather_options& o) {
  auto c = make_call(op_code::allgatherv, "allgatherv", o.timeout, out);
  c.input = flat(in);
  c.output = flat(out);
  c.counts = counts;
  return submit(std::move(c));
}

work host_backend::gather(std::vector<tensor_list>& outs, tensor_list& ins,
                          const gather_options& o) {
  // Validated: one input, and one list of outputs on the root alone.
  tensor_list none;
  return gather_one(outs.empty() ? none : outs[0], ins[0], o);
}

work host_backend::gather_one(tensor_list& outs, tensor& in, const gather_options& o) {
  if (on_tiny_lane(op_code::gatherv, in, {}, outs)) {
    tensor view;
    return on_tiny({op_code::gatherv, &flat_ref(in, view), nullptr, o.root_rank}, "gather",
                   o.timeout, {}, rank() == o.root_rank ? std::move(outs) : tensor_list{});
  }
  auto c = make_call(op_code::gatherv, "gather", o.timeout, outs);
  c.root = o.root_rank;
  c.input = flat(in);
  c.counts.assign(static_cast<std::size_t>(size()), in.numel());
  if (rank() == o.root_rank) {
    // The root's blocks straight into its outputs where they lie in a row.
    set_output(c, adjacent(outs), in, in.numel() * size(),
               [list = outs](const tensor& buf) { unpack(buf, 0, list); });
  }
  return submit(std::move(c));
}

work host_backend::gatherv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
                           const gather_options& o) {
  auto c = make_call(op_code::gatherv, "gatherv", o.timeout, out);
  c.root = o.root_rank;
  c.input = flat(in);
  if (rank() == o.root_rank) c.output = flat(out);
  c.counts = counts;
  return submit(std::move(c));
}

work host_backend::scatter(tensor_list& outs, std::vector<tensor_list>& ins,
                           const scatter_options& o) {
  // Validated: one output, and one list of inputs on the root alone.
  tensor_list none;
  return scatter_one(outs[0], ins.empty() ? none : ins[0], o);
}

work host_backend::scatter_one(tensor& out, tensor_list& ins, const scatter_options& o) {
  if (on_tiny_lane(op_code::scatterv, out, {}, ins)) {
    tensor view;
    return on_tiny({op_code::scatterv, nullptr, &flat_ref(out, view), o.root_rank, reduce_op::SUM,
                    rank() == o.root_rank ? &ins : nullptr},
                   "scatter", o.timeout, out, {});
  }
  auto c = make_call(op_code::scatterv, "scatter", o.timeout, out);
  c.root = o.root_rank;
  c.output = flat(out);
  c.input = rank() == o.root_rank ? packed(ins, c.output) : c.output;
  c.counts.assign(static_cast<std::size_t>(size()), out.numel());
  return submit(std::move(c));
}

work host_backend::scatterv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
                            const scatter_options& o) {
  auto c = make_call(op_code::scatterv, "scatterv", o.timeout, out);
  c.root = o.root_rank;
  c.output = flat(out);
  c.input = rank() == o.root_rank ? flat(in) : c.output;
  c.counts = counts;
  return submit(std::move(c));
}

work host_backend::reduce_scatter(tensor_list& outs, std::vector<tensor_list>& ins,
                                  const reduce_scatter_options& o) {
  auto c = make_call(op_code::reduce_scatterv, "reduce_scatter", o.timeout, outs);
  c.op = o.op;
  c.output = flat(outs[0]);
  c.input = packed(ins[0], c.output);
  c.counts.assign(static_cast<std::size_t>(size()), outs[0].numel());
  return submit(std::move(c));
}

work host_backend::reduce_scatter_tensor(tensor& out, tensor& in, const reduce_scatter_options& o) {
  // (PREMUL_SUM scales every input before the sum: the message algorithms'.)
  if (o.op.op() != reduce_op::PREMUL_SUM && on_tiny_lane(op_code::reduce_scatterv, out, in, {})) {
    tensor views[2];
    return on_tiny(
        {op_code::reduce_scatterv, &flat_ref(in, views[0]), &flat_ref(out, views[1]), 0, o.op.op()},
        "reduce_scatter_tensor", o.timeout, out, {});
  }
  auto c = make_call(op_code::reduce_scatterv, "reduce_scatter_tensor", o.timeout, out);
  c.op = o.op;
  c.input = flat(in);
  c.output = flat(out);
  c.counts.assign(static_cast<std::size_t>(size()), out.numel());
  return submit(std::move(c));
}

work host_backend::reduce_scatterv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
                                   const reduce_scatter_options& o) {
  auto c = make_call(op_code::reduce_scatterv, "reduce_scatterv", o.timeout, out);
  c.op = o.op;
  c.input = flat(in);
  c.output = flat(out);
  c.counts = counts;
  return submit(std::move(c));
}

work host_backend::reduce_scatter_tensor_coalesced(tensor_list& outs, tensor_list& ins,
                                                   const reduce_scatter_options& o) {
  // Block r of the packed input is the concatenation of block r of every input.
  auto c = make_call(op_code::reduce_scatterv, "reduce_scatter_tensor_coalesced", o.timeout, outs);
  c.op = o.op;
  const auto per_rank = total_numel(outs);
  c.input = like(ins[0], per_rank * size());
  std::int64_t off = 0;
  for (int r = 0; r < size(); ++r)
    for (std::size_t i = 0; i < ins.size(); ++i) {
      auto m = outs[i].numel();
      c.input.flat_slice(off, m).copy_from(flat(ins[i]).flat_slice(r * m, m));
      off += m;
    }
  c.output = like(ins[0], per_rank);
  c.counts.assign(static_cast<std::size_t>(size()), per_rank);
  c.on_success = [buf = c.output, outs] { unpack(buf, 0, outs); };
  return submit(std::move(c));
}

work host_backend::alltoall_single(tensor& out, tensor& in,
                                   const std::vector<std::int64_t>& out_splits,
                                   const std::vector<std::int64_t>& in_splits,
                                   const alltoall_options& o) {
  // Even splits that fit the tiny lane (its choice depends on the larger of
  // the two tensors, as direct_shm's does).
  if (in_splits.empty() && out_splits.empty()) {
    const bool in_larger = in.nbytes() >= out.nbytes();
    if (on_tiny_lane(op_code::alltoallv, in_larger ? in : out, in_larger ? out : in, {})) {
      tensor views[2];
      return on_tiny({op_code::alltoallv, &flat_ref(in, views[0]), &flat_ref(out, views[1])},
                     "alltoall_single", o.timeout, out, {});
    }
  }
  auto c = make_call(op_code::alltoallv, "alltoall_single", o.timeout, out);
  c.input = flat(in);
  c.output = flat(out);
  c.counts = rows_to_elements(in, in_splits);
  c.recv_counts = rows_to_elements(out, out_splits);
  c.even_splits = in_splits.empty() && out_splits.empty();
  return submit(std::move(c));
}

work host_backend::alltoall(tensor_list& outs, tensor_list& ins, const alltoall_options& o) {
  auto c = make_call(op_code::alltoallv, "alltoall", o.timeout, outs);
  set_output(c, adjacent(outs), ins[0], total_numel(outs),
             [outs](const tensor& buf) { unpack(buf, 0, outs); });
  c.input = packed(ins, c.output);
  for (auto& t : ins) c.counts.push_back(t.numel());
  for (auto& t : outs) c.recv_counts.push_back(t.numel());
  return submit(std::move(c));
}

work host_backend::barrier(const barrier_options& o) {
  if (engine_) return barrier_inline(o);
  return submit(make_call(op_code::barrier, "barrier", o.timeout, tensor_list{}));
}

work host_backend::monitored_barrier(const monitored_barrier_options& o) {
  auto c = make_call(op_code::monitored_barrier, "monitored_barrier", o.timeout, tensor_list{});
  c.wait_all_ranks = o.wait_all_ranks;
  // Rank 0 alone enforces the barrier's timeout (as c10d): the others wait
  // long enough to hear its verdict naming the missing ranks.
  if (rank() != 0) c.timeout = std::max(timeout_, 2 * c.timeout);
  return submit(std::move(c));
}

work host_backend::send(tensor_list& ts, int dst, const p2p_options& o) {
  return send_one(ts[0], dst, o);
}

work host_backend::recv(tensor_list& ts, int src, const p2p_options& o) {
  return recv_one(ts[0], src, o);
}

work host_backend::recv_any_source(tensor_list& ts, const p2p_options& o) {
  return recv_any_source_one(ts[0], o);
}

work host_backend::send_one(tensor& t, int dst, const p2p_options& o) {
  return submit_p2p(p2p_call::send, "send", dst, t, o);
}

work host_backend::recv_one(tensor& t, int src, const p2p_options& o) {
  return submit_p2p(p2p_call::recv, "recv", src, t, o);
}

work host_backend::recv_any_source_one(tensor& t, const p2p_options& o) {
  return submit_p2p(p2p_call::recv_any, "recv_any_source", -1, t, o);
}

tensor_list host_backend::flatten(const std::vector<tensor_list>& lists) {
  tensor_list r;
  for (auto& l : lists) r.insert(r.end(), l.begin(), l.end());
  return r;
}

std::vector<std::int64_t> host_backend::rows_to_elements(
    const tensor& t, const std::vector<std::int64_t>& splits) const {
  return split_elements(t, splits, size());
}

/// allreduce and reduce over several tensors: combined locally first, the result written back.
work host_backend::reducing(op_code code, const char* name, const reduce_op& op, int root,
                            int root_tensor, timeout_t timeout, tensor_list& ts, bool root_only) {
  auto c = make_call(code, name, timeout, ts);
  c.op = op;
  c.root = root;
  auto local_op =
      op.op() == reduce_op::AVG || op.op() == reduce_op::PREMUL_SUM ? reduce_op::SUM : op.op();
  std::vector<const void*> srcs;
  for (auto& t : ts) srcs.push_back(t.data());
  c.input = like(ts[0], ts[0].numel());
  if (on_cuda(c.input))
    combine_on_device(name, local_op, c.input, srcs);
  else
    reduce_many(c.input.scalar_type(), local_op, c.input.data(), srcs.data(), srcs.size(),
                static_cast<std::size_t>(ts[0].numel()));
  c.output = c.input;
  c.avg_local = static_cast<std::int64_t>(ts.size());
  const bool write = !root_only || rank() == root;
  c.on_success = [buf = c.output, ts, write, root_only, root_tensor] {
    if (!write) return;
    if (root_only) {
      flat(ts[static_cast<std::size_t>(root_tensor)]).copy_from(buf);
      return;
    }
    for (auto& t : ts) flat(t).copy_from(buf);
  };
  return submit(std::move(c));
}

work host_backend::reducing_one(op_code code, const char* name, const reduce_op& op, int root,
                                timeout_t timeout, tensor& t) {
  auto c = make_call(code, name, timeout, t);
  c.op = op;
  c.root = root;
  c.input = c.output = flat(t);
  return submit(std::move(c));
}

/// An allgather of this rank's `ins` packed into one block; `scatter_out`
/// copies the gathered buffer into the caller's outputs.
template <class F>
work host_backend::gather_blocks(const char* name, timeout_t timeout, const tensor_list& ins,
                                 F scatter_out, const tensor_list& outputs, const tensor& in_row) {
  auto c = make_call(op_code::allgatherv, name, timeout, outputs);
  c.input = ins.size() == 1 ? flat(ins[0]) : pack(ins);
  c.counts.assign(static_cast<std::size_t>(size()), c.input.numel());
  set_output(c, in_row, ins[0], c.input.numel() * size(),
             [f = std::move(scatter_out), n = size()](const tensor& buf) { f(buf, n); });
  return submit(std::move(c));
}

work host_backend::gather_mixed(const char* name, timeout_t timeout, const tensor_list& ins,
                                const tensor_list& outputs,
                                std::function<tensor(int, std::size_t)> out) {
  auto c = make_call(op_code::allgatherv, name, timeout, outputs);
  c.input = mixed_block(ins);
  c.counts.assign(static_cast<std::size_t>(size()), c.input.numel());
  c.output = like(c.input, c.input.numel() * size());
  c.on_success = [name, buf = c.output, n = size(), k = ins.size(), out = std::move(out)] {
    unpack_mixed_blocks(name, buf, n, k, out);
  };
  return submit(std::move(c));
}

tensor host_backend::packed(const tensor_list& ts, const tensor& output) {
  auto row = adjacent(ts);
  return row.defined() && !overlaps(row, output) ? row : pack(ts);
}

template <class F>
void host_backend::set_output(collective_call& c, const tensor& row, const tensor& like_of,
                              std::int64_t numel, F unpack_out) {
  if (row.defined() && row.numel() == numel && !overlaps(row, c.input)) {
    c.output = row;
    return;
  }
  c.output = like(like_of, numel);
  c.on_success = [buf = c.output, unpack_out = std::move(unpack_out)] { unpack_out(buf); };
}

collective_call host_backend::make_call(op_code code, const char* name, timeout_t timeout,
                                        const tensor_list& outputs) {
  auto c = new_call(code, name, timeout);
  if (outputs.size() == 1 && outputs[0].defined())
    c.sole_output = outputs[0];
  else
    c.outputs = outputs;
  return c;
}

collective_call host_backend::make_call(op_code code, const char* name, timeout_t timeout,
                                        const tensor& output) {
  auto c = new_call(code, name, timeout);
  if (output.defined())
    c.sole_output = output;
  else
    c.outputs = {output};
  return c;
}

collective_call host_backend::new_call(op_code code, const char* name, timeout_t timeout) {
  collective_call c;
  c.code = code;
  c.name = name;
  c.timeout = timeout == use_group_timeout ? timeout_ : timeout;
  // No work yet: the route makes it (an inline engine once this rank posted).
  return c;
}

}  // namespace troupe::detail
