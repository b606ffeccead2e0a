// process_group's collectives and their variable-size forms: each checks
// its arguments on this rank (api/validate.hpp), then the backend of the
// tensors' device issues it and track() records it.

#include "troupe/process_group.hpp"

#include "api/validate.hpp"
#include "base/tensor_util.hpp"
#include "troupe/error.hpp"

namespace troupe {

using detail::validator;

// -- collectives ---------------------------------------------------------------

namespace {

/// gather's and scatter's checks: `mine` is this rank's one tensor
/// (gather's input, scatter's output); on the root, `all` holds one list of
/// a tensor per rank like it, and elsewhere nothing.
void check_rooted_lists(const validator& v, int root, std::span<const tensor> mine,
                        std::span<const tensor_list> all, bool mine_is_input) {
  // The names as literals: a text built per call costs about 1,000
  // instructions of a small gather's root.
  const char* mine_name = mine_is_input ? "input_tensors" : "output_tensors";
  const char* all_name = mine_is_input ? "output_tensors" : "input_tensors";
  v.rank_arg(root, "root_rank");
  v.tensors(mine, mine_name);
  v.length(mine.size(), 1, mine_name);
  if (v.rank() == root) {
    v.length(all.size(), 1,
             mine_is_input ? "output_tensors on the root" : "input_tensors on the root");
    v.length(all[0].size(), static_cast<std::size_t>(v.size()),
             mine_is_input ? "output_tensors[0] on the root" : "input_tensors[0] on the root");
    v.tensors(all[0], mine_is_input ? "output_tensors[0]" : "input_tensors[0]");
    v.same_dtype(all[0], mine[0]);
    for (auto& t : all[0])
      v.numel(t.numel(), mine[0].numel(), mine_is_input ? "an output tensor" : "an input tensor");
  } else if (!all.empty()) {
    v.fail(std::string(all_name) + " must be empty on non-root rank " + std::to_string(v.rank()) +
           " (root is " + std::to_string(root) + ")");
  }
}

/// The one-tensor forms' list of the root (one list of a tensor per rank),
/// as the list forms hold it: one list where there is one, else none.
std::span<const tensor_list> root_lists(const tensor_list& l) {
  return l.empty() ? std::span<const tensor_list>{} : std::span<const tensor_list>{&l, 1};
}

/// The root rank and the root's tensor in range.
void check_root(const validator& v, std::span<const tensor> ts, int root, int root_tensor) {
  v.rank_arg(root, "root_rank");
  if (root_tensor < 0 || root_tensor >= static_cast<int>(ts.size()))
    v.fail("root_tensor " + std::to_string(root_tensor) + " is out of range for " +
           std::to_string(ts.size()) + " tensor(s)");
}

/// A list that mixes complex tensors with real ones of their element type
/// (validator::same_real_dtype), as c10d reduces it: every complex tensor
/// replaced by the pairs of reals it is made of (view_as_real), which SUM,
/// AVG and PREMUL_SUM reduce as they would its complex values. The other
/// ops are refused for complex tensors, as c10d's supports_complex does
/// (troupe reduces a list of complex tensors alone as complex values: MIN
/// and MAX are refused there too, PRODUCT is the complex product).
void complex_as_real(const validator& v, const reduce_op& op, tensor_list& ts) {
  const auto k = op.op();
  if (k != reduce_op::SUM && k != reduce_op::AVG && k != reduce_op::PREMUL_SUM)
    v.fail(std::string("ReduceOp ") + to_string(k) +
           " is not supported on complex tensors mixed with real ones: they are reduced as "
           "pairs of reals, as c10d views them (SUM, AVG and PREMUL_SUM only)");
  for (auto& t : ts) {
    const auto d = t.scalar_type();
    if (is_complex(d))
      t = detail::tensor_access::reinterpreted(
          t, d == dtype::complex64 ? dtype::float32 : dtype::float64);
  }
}

void check_same_size(const validator& v, std::span<const tensor> ts) {
  for (auto& t : ts) v.numel(t.numel(), ts[0].numel(), "a tensor");
}

// broadcast, allreduce and reduce, of a list and of one tensor alike.
void check_broadcast(const validator& v, std::span<const tensor> ts, const broadcast_options& o) {
  v.tensors(ts, "tensors");
  check_root(v, ts, o.root_rank, o.root_tensor);
  check_same_size(v, ts);
}

void check_allreduce(const validator& v, std::span<const tensor> ts, const allreduce_options& o) {
  v.tensors(ts, "tensors");
  check_same_size(v, ts);
  check_reduce_supported("allreduce", o.op, ts[0].scalar_type());
}

void check_reduce(const validator& v, std::span<const tensor> ts, const reduce_options& o) {
  v.tensors(ts, "tensors");
  check_root(v, ts, o.root_rank, o.root_tensor);
  check_same_size(v, ts);
  check_reduce_supported("reduce", o.op, ts[0].scalar_type());
}

}  // namespace

work process_group::broadcast(tensor_list ts, const broadcast_options& o) {
  check_member("broadcast");
  check_broadcast({"broadcast", rank_, size()}, ts, o);
  return track(backend_for("broadcast", ts).broadcast(ts, o), "broadcast", ts, -1);
}

work process_group::broadcast(tensor t, const broadcast_options& o) {
  check_member("broadcast");
  const std::span<const tensor> ts{&t, 1};
  check_broadcast({"broadcast", rank_, size()}, ts, o);
  return track(backend_for("broadcast", ts).broadcast_one(t, o), "broadcast", ts, -1);
}

work process_group::allreduce(tensor_list ts, const allreduce_options& o) {
  check_member("allreduce");
  check_allreduce({"allreduce", rank_, size()}, ts, o);
  return track(backend_for("allreduce", ts).allreduce(ts, o), "allreduce", ts, -1);
}

work process_group::allreduce(tensor t, const allreduce_options& o) {
  check_member("allreduce");
  const std::span<const tensor> ts{&t, 1};
  check_allreduce({"allreduce", rank_, size()}, ts, o);
  return track(backend_for("allreduce", ts).allreduce_one(t, o), "allreduce", ts, -1);
}

work process_group::allreduce_coalesced(tensor_list ts, const allreduce_coalesced_options& o) {
  check_member("allreduce_coalesced");
  validator v{"allreduce_coalesced", rank_, size()};
  if (v.same_real_dtype(ts, "tensors")) complex_as_real(v, o.op, ts);
  check_reduce_supported("allreduce_coalesced", o.op, ts[0].scalar_type());
  return track(backend_for("allreduce_coalesced", ts).allreduce_coalesced(ts, o),
               "allreduce_coalesced", ts, -1);
}

work process_group::reduce(tensor_list ts, const reduce_options& o) {
  check_member("reduce");
  check_reduce({"reduce", rank_, size()}, ts, o);
  return track(backend_for("reduce", ts).reduce(ts, o), "reduce", ts, -1);
}

work process_group::reduce(tensor t, const reduce_options& o) {
  check_member("reduce");
  const std::span<const tensor> ts{&t, 1};
  check_reduce({"reduce", rank_, size()}, ts, o);
  return track(backend_for("reduce", ts).reduce_one(t, o), "reduce", ts, -1);
}

work process_group::allgather(std::vector<tensor_list> outs, tensor_list ins,
                              const allgather_options& o) {
  check_member("allgather");
  validator v{"allgather", rank_, size()};
  v.tensors(ins, "input_tensors");
  v.length(outs.size(), ins.size(), "output_tensors (one list per input)");
  for (std::size_t i = 0; i < outs.size(); ++i) {
    v.length(outs[i].size(), static_cast<std::size_t>(size()), "output_tensors[i]");
    v.tensors(outs[i], "output_tensors[i]");
    v.same_dtype(outs[i], ins[i]);
    for (auto& t : outs[i]) v.numel(t.numel(), ins[i].numel(), "an output tensor");
  }
  return track(backend_for("allgather", ins).allgather(outs, ins, o), "allgather", ins, -1);
}

work process_group::allgather(tensor_list outs, tensor in, const allgather_options& o) {
  return allgather(std::vector<tensor_list>{std::move(outs)}, tensor_list{std::move(in)}, o);
}

work process_group::allgather_into_tensor(tensor out, tensor in, const allgather_options& o) {
  check_member("allgather_into_tensor");
  validator v{"allgather_into_tensor", rank_, size()};
  v.pair(in, out, "tensors");
  v.numel(out.numel(), in.numel() * size(), "output_tensor");
  const std::span<const tensor> ts{&in, 1};
  return track(backend_for("allgather_into_tensor", ts).allgather_into_tensor(out, in, o),
               "allgather_into_tensor", ts, -1);
}

work process_group::allgather_coalesced(std::vector<tensor_list> outs, tensor_list ins,
                                        const allgather_options& o) {
  check_member("allgather_coalesced");
  validator v{"allgather_coalesced", rank_, size()};
  // Each input of its own dtype, as c10d's (ProcessGroupGloo checks the
  // outputs position by position).
  v.mixed(ins, "input_tensors");
  v.length(outs.size(), static_cast<std::size_t>(size()),
           "output_tensor_lists (one list per rank)");
  for (std::size_t r = 0; r < outs.size(); ++r) {
    const auto& per_rank = outs[r];
    v.length(per_rank.size(), ins.size(), "output_tensor_lists[r]");
    v.mixed(per_rank, "output_tensor_lists[r]");
    v.dtypes_by_position(per_rank, "output_tensor_lists", ins, "input_tensors",
                         static_cast<std::ptrdiff_t>(r));
    for (std::size_t i = 0; i < ins.size(); ++i)
      v.numel(per_rank[i].numel(), ins[i].numel(), "an output tensor");
  }
  return track(backend_for("allgather_coalesced", ins).allgather_coalesced(outs, ins, o),
               "allgather_coalesced", ins, -1);
}

work process_group::allgather_into_tensor_coalesced(tensor_list outs, tensor_list ins,
                                                    const allgather_options& o) {
  check_member("allgather_into_tensor_coalesced");
  validator v{"allgather_into_tensor_coalesced", rank_, size()};
  v.mixed(ins, "inputs");  // each of its own dtype, as allgather_coalesced's
  v.length(outs.size(), ins.size(), "outputs");
  v.mixed(outs, "outputs");
  v.dtypes_by_position(outs, "outputs", ins, "inputs");
  for (std::size_t i = 0; i < ins.size(); ++i)
    v.numel(outs[i].numel(), ins[i].numel() * size(), "outputs[i]");
  return track(backend_for("allgather_into_tensor_coalesced", ins)
                   .allgather_into_tensor_coalesced(outs, ins, o),
               "allgather_into_tensor_coalesced", ins, -1);
}

work process_group::gather(std::vector<tensor_list> outs, tensor_list ins,
                           const gather_options& o) {
  check_member("gather");
  check_rooted_lists({"gather", rank_, size()}, o.root_rank, ins, outs, true);
  return track(backend_for("gather", ins).gather(outs, ins, o), "gather", ins, -1);
}

work process_group::gather(tensor_list outs, tensor in, const gather_options& o) {
  // Checked as the list form would be (one list of outputs on the root,
  // none elsewhere) without building the lists.
  check_member("gather");
  const std::span<const tensor> ts{&in, 1};
  check_rooted_lists({"gather", rank_, size()}, o.root_rank, ts, root_lists(outs), true);
  return track(backend_for("gather", ts).gather_one(outs, in, o), "gather", ts, -1);
}

work process_group::scatter(tensor_list outs, std::vector<tensor_list> ins,
                            const scatter_options& o) {
  check_member("scatter");
  check_rooted_lists({"scatter", rank_, size()}, o.root_rank, outs, ins, false);
  return track(backend_for("scatter", outs).scatter(outs, ins, o), "scatter", outs, -1);
}

work process_group::scatter(tensor out, tensor_list ins, const scatter_options& o) {
  check_member("scatter");
  const std::span<const tensor> ts{&out, 1};
  check_rooted_lists({"scatter", rank_, size()}, o.root_rank, ts, root_lists(ins), false);
  return track(backend_for("scatter", ts).scatter_one(out, ins, o), "scatter", ts, -1);
}

work process_group::reduce_scatter(tensor_list outs, std::vector<tensor_list> ins,
                                   const reduce_scatter_options& o) {
  check_member("reduce_scatter");
  validator v{"reduce_scatter", rank_, size()};
  v.tensors(outs, "output_tensors");
  v.length(outs.size(), 1, "output_tensors");
  v.length(ins.size(), 1, "input_tensors");
  v.length(ins[0].size(), static_cast<std::size_t>(size()), "input_tensors[0]");
  v.tensors(ins[0], "input_tensors[0]");
  v.same_dtype(ins[0], outs[0]);
  for (auto& t : ins[0]) v.numel(t.numel(), outs[0].numel(), "an input tensor");
  check_reduce_supported("reduce_scatter", o.op, outs[0].scalar_type());
  return track(backend_for("reduce_scatter", outs).reduce_scatter(outs, ins, o), "reduce_scatter",
               outs, -1);
}

work process_group::reduce_scatter(tensor out, tensor_list ins, const reduce_scatter_options& o) {
  return reduce_scatter(tensor_list{std::move(out)}, std::vector<tensor_list>{std::move(ins)}, o);
}

work process_group::reduce_scatter_tensor(tensor out, tensor in, const reduce_scatter_options& o) {
  check_member("reduce_scatter_tensor");
  validator v{"reduce_scatter_tensor", rank_, size()};
  v.pair(in, out, "tensors");
  v.numel(in.numel(), out.numel() * size(), "input_tensor");
  check_reduce_supported("reduce_scatter_tensor", o.op, out.scalar_type());
  const std::span<const tensor> ts{&out, 1};
  return track(backend_for("reduce_scatter_tensor", ts).reduce_scatter_tensor(out, in, o),
               "reduce_scatter_tensor", ts, -1);
}

work process_group::reduce_scatter_tensor_coalesced(tensor_list outs, tensor_list ins,
                                                    const reduce_scatter_options& o) {
  check_member("reduce_scatter_tensor_coalesced");
  validator v{"reduce_scatter_tensor_coalesced", rank_, size()};
  const bool mixes = v.same_real_dtype(ins, "inputs");
  v.length(outs.size(), ins.size(), "outputs");
  v.mixed(outs, "outputs");
  v.dtypes_by_position(outs, "outputs", ins, "inputs");
  for (std::size_t i = 0; i < ins.size(); ++i)
    v.numel(ins[i].numel(), outs[i].numel() * size(), "inputs[i]");
  if (mixes) {
    complex_as_real(v, o.op, ins);
    complex_as_real(v, o.op, outs);
  }
  check_reduce_supported("reduce_scatter_tensor_coalesced", o.op, ins[0].scalar_type());
  return track(backend_for("reduce_scatter_tensor_coalesced", ins)
                   .reduce_scatter_tensor_coalesced(outs, ins, o),
               "reduce_scatter_tensor_coalesced", ins, -1);
}

work process_group::alltoall_single(tensor out, tensor in, std::vector<std::int64_t> out_splits,
                                    std::vector<std::int64_t> in_splits,
                                    const alltoall_options& o) {
  check_member("alltoall_single");
  validator v{"alltoall_single", rank_, size()};
  v.pair(in, out, "tensors");
  auto rows = [](const tensor& t) { return t.dim() == 0 ? std::int64_t{1} : t.shape()[0]; };
  auto row_size = [&](const tensor& t) { return rows(t) == 0 ? 0 : t.numel() / rows(t); };
  if (in.numel() > 0 && out.numel() > 0 && row_size(in) != row_size(out))
    v.fail("input rows have " + std::to_string(row_size(in)) + " elements but output rows have " +
           std::to_string(row_size(out)));
  auto check_splits = [&](const std::vector<std::int64_t>& s, const tensor& t, const char* what) {
    if (s.empty()) {
      if (rows(t) % size() != 0)
        v.fail(std::string(what) + " is empty, so dim 0 of size " + std::to_string(rows(t)) +
               " must divide evenly by the group size " + std::to_string(size()));
      return;
    }
    auto sum = v.counts(s, what);
    if (sum != rows(t))
      v.fail(std::string(what) + " sum to " + std::to_string(sum) + " but dim 0 has " +
             std::to_string(rows(t)) + " rows");
  };
  check_splits(in_splits, in, "input_split_sizes");
  check_splits(out_splits, out, "output_split_sizes");
  const std::span<const tensor> ts{&in, 1};
  return track(
      backend_for("alltoall_single", ts).alltoall_single(out, in, out_splits, in_splits, o),
      "alltoall_single", ts, -1);
}

work process_group::alltoall(tensor_list outs, tensor_list ins, const alltoall_options& o) {
  check_member("alltoall");
  validator v{"alltoall", rank_, size()};
  v.length(ins.size(), static_cast<std::size_t>(size()), "input_tensors");
  v.length(outs.size(), static_cast<std::size_t>(size()), "output_tensors");
  v.tensors(ins, "input_tensors");
  v.tensors(outs, "output_tensors");
  v.same_dtype(outs, ins[0]);
  return track(backend_for("alltoall", ins).alltoall(outs, ins, o), "alltoall", ins, -1);
}

void process_group::check_device_ids(const std::vector<std::int64_t>& ids) const {
  validator v{"barrier", rank_, size()};
  auto name = [&](std::size_t i) {
    return "device_ids[" + std::to_string(i) + "] " + std::to_string(ids[i]);
  };
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0) v.fail(name(i) + " is negative: device ids are CUDA device indices");
    for (std::size_t j = 0; j < i; ++j)
      if (ids[j] == ids[i])
        v.fail(name(i) + " appears twice (also device_ids[" + std::to_string(j) + "])");
  }
  const int devices = cuda_device_count();
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= devices)
      v.fail(name(i) + " names no device of this process (" + cuda_status() + ")");
}

work process_group::barrier(const barrier_options& o) {
  check_member("barrier");
  if (!o.device_ids.empty()) check_device_ids(o.device_ids);
  return track(tensorless_backend().barrier(o), "barrier", {}, -1);
}

work process_group::monitored_barrier(const monitored_barrier_options& o) {
  check_member("monitored_barrier");
  return track(tensorless_backend().monitored_barrier(o), "monitored_barrier", {}, -1);
}

// -- variable-size forms -----------------------------------------------------------

namespace {

/// gatherv's and scatterv's checks: this rank's block (gatherv's input,
/// scatterv's output) holds its count of elements; on the root, the other
/// tensor holds every rank's block.
void check_rooted_blocks(const validator& v, int root, const std::vector<std::int64_t>& counts,
                         const tensor& in, const tensor& out, bool block_is_input) {
  const auto& block = block_is_input ? in : out;
  const auto& all = block_is_input ? out : in;
  const char* block_name = block_is_input ? "input" : "output";
  v.rank_arg(root, "root_rank");
  v.tensor1(block, block_name);
  const auto sum = v.blocks(counts, block, block_name);
  if (v.rank() == root) {
    v.pair(in, out, "tensors");
    v.all_blocks(all, sum, block_is_input ? "output" : "input");
  }
}

}  // namespace

work process_group::allgatherv(tensor out, tensor in, std::vector<std::int64_t> counts,
                               const allgather_options& o) {
  check_member("allgatherv");
  validator v{"allgatherv", rank_, size()};
  v.pair(in, out, "tensors");
  v.all_blocks(out, v.blocks(counts, in, "input"), "output");
  const std::span<const tensor> ts{&in, 1};
  return track(backend_for("allgatherv", ts).allgatherv(out, in, counts, o), "allgatherv", ts, -1);
}

work process_group::gatherv(tensor out, tensor in, std::vector<std::int64_t> counts,
                            const gather_options& o) {
  check_member("gatherv");
  check_rooted_blocks({"gatherv", rank_, size()}, o.root_rank, counts, in, out, true);
  const std::span<const tensor> ts{&in, 1};
  return track(backend_for("gatherv", ts).gatherv(out, in, counts, o), "gatherv", ts, -1);
}

work process_group::scatterv(tensor out, tensor in, std::vector<std::int64_t> counts,
                             const scatter_options& o) {
  check_member("scatterv");
  check_rooted_blocks({"scatterv", rank_, size()}, o.root_rank, counts, in, out, false);
  const std::span<const tensor> ts{&out, 1};
  return track(backend_for("scatterv", ts).scatterv(out, in, counts, o), "scatterv", ts, -1);
}

work process_group::reduce_scatterv(tensor out, tensor in, std::vector<std::int64_t> counts,
                                    const reduce_scatter_options& o) {
  check_member("reduce_scatterv");
  validator v{"reduce_scatterv", rank_, size()};
  v.pair(in, out, "tensors");
  v.all_blocks(in, v.blocks(counts, out, "output"), "input");
  check_reduce_supported("reduce_scatterv", o.op, in.scalar_type());
  const std::span<const tensor> ts{&in, 1};
  return track(backend_for("reduce_scatterv", ts).reduce_scatterv(out, in, counts, o),
               "reduce_scatterv", ts, -1);
}

}  // namespace troupe
