// process_group's point-to-point calls: send, recv, recv_any_source and
// batch_isend_irecv, checked on this rank, then issued by the backend of the
// buffers' device and recorded by track().

#include "troupe/process_group.hpp"

#include <algorithm>

#include "api/validate.hpp"
#include "base/sim_conductor.hpp"
#include "troupe/error.hpp"

namespace troupe {

using detail::validator;

// -- point to point ------------------------------------------------------------------

namespace {

void check_peer(const validator& v, int peer, int rank, const char* what) {
  v.rank_arg(peer, what);
  if (peer == rank)
    v.fail(std::string(what) + " " + std::to_string(peer) +
           " is this rank; sending to or receiving from self is not supported");
}

void check_p2p_tensors(const validator& v, std::span<const tensor> ts, int tag) {
  v.tensors(ts, "tensors");
  v.length(ts.size(), 1, "tensors");
  if (tag < 0) v.fail("tag " + std::to_string(tag) + " is negative");
}

}  // namespace

// The list forms (c10d's) hold exactly one tensor, issued as the tensor itself.
work process_group::send(tensor_list ts, int dst, const p2p_options& o) {
  check_member("send");
  check_p2p_tensors({"send", rank_, size()}, ts, o.tag);
  return send(std::move(ts[0]), dst, o);
}

work process_group::recv(tensor_list ts, int src, const p2p_options& o) {
  check_member("recv");
  check_p2p_tensors({"recv", rank_, size()}, ts, o.tag);
  return recv(std::move(ts[0]), src, o);
}

work process_group::recv_any_source(tensor_list ts, const p2p_options& o) {
  check_member("recv_any_source");
  check_p2p_tensors({"recv_any_source", rank_, size()}, ts, o.tag);
  return recv_any_source(std::move(ts[0]), o);
}

work process_group::send(tensor t, int dst, const p2p_options& o) {
  check_member("send");
  validator v{"send", rank_, size()};
  const std::span<const tensor> ts{&t, 1};
  check_p2p_tensors(v, ts, o.tag);
  check_peer(v, dst, rank_, "dst_rank");
  return track(backend_for("send", ts).send_one(t, dst, o), "send", ts, dst);
}

work process_group::recv(tensor t, int src, const p2p_options& o) {
  check_member("recv");
  validator v{"recv", rank_, size()};
  const std::span<const tensor> ts{&t, 1};
  check_p2p_tensors(v, ts, o.tag);
  check_peer(v, src, rank_, "src_rank");
  return track(backend_for("recv", ts).recv_one(t, src, o), "recv", ts, src);
}

work process_group::recv_any_source(tensor t, const p2p_options& o) {
  check_member("recv_any_source");
  validator v{"recv_any_source", rank_, size()};
  const std::span<const tensor> ts{&t, 1};
  check_p2p_tensors(v, ts, o.tag);
  return track(backend_for("recv_any_source", ts).recv_any_source_one(t, o), "recv_any_source", ts,
               -1);
}

work process_group::batch_isend_irecv(std::vector<p2p_op> ops) {
  check_member("batch_isend_irecv");
  validator v{"batch_isend_irecv", rank_, size()};
  if (ops.empty()) v.fail("the list of operations is empty");
  // Validate every op first, so that a bad one issues nothing.
  for (auto& op : ops) {
    check_p2p_tensors(v, {&op.buffer, 1}, op.tag);
    check_peer(v, op.peer, rank_, op.kind == p2p_op::isend ? "isend peer" : "irecv peer");
  }
  // Every buffer on one device: that device's backend issues the batch
  // (NCCL groups it); otherwise each op goes to its own device's backend.
  const auto d = ops.front().buffer.get_device().type;
  const bool one_device = std::all_of(
      ops.begin(), ops.end(), [d](const p2p_op& op) { return op.buffer.get_device().type == d; });
  if (one_device) {
    call_size size;
    for (auto& op : ops) size.add(op.buffer);
    auto w = track_sized(
        backend_for("batch_isend_irecv", {&ops.front().buffer, 1}).batch_isend_irecv(ops),
        "batch_isend_irecv", size, -1);
    if (detail::timed_here()) {
      // A timed simulation's clock times each of the batch's operations.
      detail::sim_call c{"batch_isend_irecv", name_, global_ranks_, rank_, size.bytes, -1, {}};
      for (auto& op : ops)
        c.parts.push_back({op.kind == p2p_op::isend, op.peer, op.buffer.nbytes()});
      detail::sim_issued(w.state(), c);
    }
    return w;
  }
  std::vector<work> parts;
  const bool outer = coalescing_;
  coalescing_ = false;  // the parts are tracked as one work below
  for (auto& op : ops)
    parts.push_back(op.kind == p2p_op::isend ? send(op.buffer, op.peer, op.tag)
                                             : recv(op.buffer, op.peer, op.tag));
  coalescing_ = outer;
  return track(work::when_all("batch_isend_irecv", name_, std::move(parts)), "batch_isend_irecv",
               {}, -1);
}

}  // namespace troupe
