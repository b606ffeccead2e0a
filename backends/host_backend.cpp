// The "actor" backend: plans each c10d call onto one of the algorithm
// families (base/call.hpp) over flat buffers, and submits it to the group
// actor through the rank's work relay. Arguments arrive validated by
// process_group; cross-rank mismatches are caught by the algorithms.
// When every rank of the group shares this host, allreduce runs on the
// group's shared-memory engine instead (inline/engine.hpp): no messages,
// advanced by the threads that wait for it.

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>

#include "actors/group_actor.hpp"
#include "backends/cuda_staging.hpp"
#ifdef TROUPE_HAVE_CUDA
#include "backends/device_ops.hpp"
#include "cuda/device_actor.hpp"
#endif
#ifdef TROUPE_HAVE_NCCL
#include "backends/nccl_backend.hpp"
#endif
#include "actors/in_process.hpp"
#include "actors/mixed.hpp"
#include "actors/rank_runtime.hpp"
#include "backends/device_exchange.hpp"
#include "base/tensor_util.hpp"
#include "base/work_state.hpp"
#include "inline/algorithm_op.hpp"
#include "inline/engine.hpp"
#include "inline/medium.hpp"
#include "inline/open_engines.hpp"
#include "inline/shm/allreduce_shm.hpp"
#include "inline/shm/direct_shm.hpp"
#include "kernels/reduce_kernels.hpp"
#include "transport/data_plane.hpp"
#include "troupe/backend.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

struct registry_entry {
  backend_creator creator;
  std::vector<device_type> devices;
};

namespace {

tensor flat(const tensor& t) {
  return t.defined() ? t.view({t.numel()}) : t;
}

/// A new flat buffer of `n` elements of `t`'s dtype on `t`'s device.
tensor like(const tensor& t, std::int64_t n) {
  return tensor::empty({n}, t.scalar_type(), t.get_device());
}

bool on_cuda(const tensor& t) {
  return t.defined() && t.get_device().type == device_type::cuda;
}

std::int64_t total_numel(const tensor_list& ts) {
  std::int64_t n = 0;
  for (auto& t : ts) n += t.numel();
  return n;
}

/// Copies the tensors one after another into a new flat buffer.
tensor pack(const tensor_list& ts) {
  auto buf = like(ts.front(), total_numel(ts));
  std::int64_t off = 0;
  for (auto& t : ts) {
    buf.flat_slice(off, t.numel()).copy_from(flat(t));
    off += t.numel();
  }
  return buf;
}

/// Copies consecutive parts of `buf`, starting at `off`, into the tensors.
std::int64_t unpack(const tensor& buf, std::int64_t off, const tensor_list& ts) {
  for (auto& t : ts) {
    flat(t).copy_from(buf.flat_slice(off, t.numel()));
    off += t.numel();
  }
  return off;
}

class actor_backend final : public backend {
 public:
  explicit actor_backend(const backend_context& ctx)
      : backend(ctx),
        rt_(*static_cast<rank_runtime*>(ctx.runtime)),
        timeout_(ctx.timeout),
        debug_(ctx.debug),
        key_prefix_(rt_.job() + "/" + ctx.group_name + "/") {
    group_ = spawn_group_actor(rt_.system(),
                               group_info{ctx.group_name, ctx.rank, ctx.size, ctx.global_ranks});
    auto& dir = in_process_directory::instance();
    dir.put(key_prefix_ + std::to_string(ctx.rank), group_);
    const auto& plane = rt_.plane();
    if (plane) plane->add_group(ctx.group_name, ctx.global_ranks, group_);
    auto in_other_process = [&](int r) {
      return plane && !plane->is_local(ctx.global_ranks[static_cast<std::size_t>(r)]);
    };
    // Find the group actor of every peer in this process (they create theirs
    // concurrently); peers in other processes are reached through the data plane.
    std::vector<group_actor> peers;
    bool mixed = false;
    for (int r = 0; r < ctx.size; ++r) {
      if (in_other_process(r)) {
        mixed = true;
        peers.emplace_back();
        continue;
      }
      auto p = r == ctx.rank ? group_ : dir.find(key_prefix_ + std::to_string(r), ctx.timeout);
      if (!p) {
        shutdown("group set-up failed");
        throw error(errc::timeout,
                    "new_group: Timeout after " + std::to_string(ctx.timeout.count()) +
                        " ms waiting for rank " + std::to_string(r) + " (world rank " +
                        std::to_string(ctx.global_ranks[static_cast<std::size_t>(r)]) +
                        ") to create group '" + ctx.group_name + "'");
      }
      peers.push_back(p);
    }
    std::shared_ptr<transport> net;
    if (mixed)
      net = std::make_shared<mixed_transport>(std::move(peers), ctx.global_ranks, plane,
                                              ctx.group_name);
    else
      net = std::make_shared<in_process_transport>(std::move(peers), ctx.global_ranks);
    caf::scoped_actor self{rt_.system()};
    self->request(group_, caf::infinite, peers_atom::value, net)
        .receive([](bool) {}, [](caf::error&) {});
    // Return only once every member found every other: a member that returns
    // early could otherwise leave (destroy the group) before a peer found it.
    try {
      store_based_barrier(*ctx.store, ctx.rank, ctx.size, "created", ctx.timeout);
      std::vector<std::string> names;
      for (int r = 0; r < ctx.size; ++r) names.push_back(net->describe_peer(r));
      auto f = open_inline_engines(ctx, names, plane, key_prefix_ + "fabric/",
                                   debug_ != debug_level::off);
      engine_ = std::move(f.main);
      messages_ = std::move(f.messages);
      shm_ = f.shm;
      // Beside a shared-memory engine, operations on messages read the
      // peers' announcements from the segment.
      if (messages_) messages_->read_announcements_from(engine_->medium_ptr());
#ifdef TROUPE_HAVE_CUDA
      // Ranks that share this process share their device memory too.
      if (!mixed)
        exchange_ =
            gpu::device_exchange::open(key_prefix_ + "device", ctx.size, gpu::cuda_device_ops());
#endif
    } catch (...) {
      shutdown("group set-up failed");
      throw;
    }
  }

  ~actor_backend() override {
    shutdown("the group was destroyed");
  }

  std::string name() const override {
    return "actor";
  }

  work broadcast(tensor_list& ts, const broadcast_options& o) override {
    auto c = make_call(op_code::broadcast, "broadcast", o.timeout, ts);
    c->root = o.root_rank;
    auto buf = flat(ts[static_cast<std::size_t>(rank() == o.root_rank ? o.root_tensor : 0)]);
    c->input = c->output = buf;
    if (ts.size() > 1)
      c->on_success = [buf, ts] {
        for (auto& t : ts)
          if (!flat(t).is_same(buf)) flat(t).copy_from(buf);
      };
    return submit(c);
  }

  work allreduce(tensor_list& ts, const allreduce_options& o) override {
    // The inline engine takes one CPU tensor and every op but PREMUL_SUM (its scale
    // may be a tensor). The choice depends only on what every rank passes alike.
    if (engine_ && ts.size() == 1 && ts[0].get_device().type == device_type::cpu &&
        o.op.op() != reduce_op::PREMUL_SUM)
      return allreduce_inline(ts[0], o);
    return reducing(op_code::allreduce, "allreduce", o.op, 0, 0, o.timeout, ts, false);
  }

  work allreduce_coalesced(tensor_list& ts, const allreduce_coalesced_options& o) override {
    auto c = make_call(op_code::allreduce, "allreduce_coalesced", o.timeout, ts);
    c->op = o.op;
    c->input = c->output = pack(ts);
    c->on_success = [buf = c->output, ts] { unpack(buf, 0, ts); };
    return submit(c);
  }

  work reduce(tensor_list& ts, const reduce_options& o) override {
    return reducing(op_code::reduce, "reduce", o.op, o.root_rank, o.root_tensor, o.timeout, ts,
                    true);
  }

  work allgather(std::vector<tensor_list>& outs, tensor_list& ins,
                 const allgather_options& o) override {
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
        flatten(outs));
  }

  work allgather_coalesced(std::vector<tensor_list>& outs, tensor_list& ins,
                           const allgather_options& o) override {
    // outs[r][i] <- rank r's ins[i]
    return gather_blocks(
        "allgather_coalesced", o.timeout, ins,
        [outs](const tensor& all, int) {
          std::int64_t off = 0;
          for (auto& per_rank : outs) off = unpack(all, off, per_rank);
        },
        flatten(outs));
  }

  work allgather_into_tensor_coalesced(tensor_list& outs, tensor_list& ins,
                                       const allgather_options& o) override {
    // outs[i] holds size blocks of ins[i]'s numel; the gathered buffer is rank-major.
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
        outs);
  }

  work allgather_into_tensor(tensor& out, tensor& in, const allgather_options& o) override {
    auto c = make_call(op_code::allgatherv, "allgather_into_tensor", o.timeout, {out});
    c->input = flat(in);
    c->output = flat(out);
    c->counts.assign(static_cast<std::size_t>(size()), in.numel());
    return submit(c);
  }

  work allgatherv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
                  const allgather_options& o) override {
    auto c = make_call(op_code::allgatherv, "allgatherv", o.timeout, {out});
    c->input = flat(in);
    c->output = flat(out);
    c->counts = counts;
    return submit(c);
  }

  work gather(std::vector<tensor_list>& outs, tensor_list& ins, const gather_options& o) override {
    auto c = make_call(op_code::gatherv, "gather", o.timeout, flatten(outs));
    c->root = o.root_rank;
    c->input = flat(ins[0]);
    c->counts.assign(static_cast<std::size_t>(size()), ins[0].numel());
    if (rank() == o.root_rank) {
      c->output = like(ins[0], ins[0].numel() * size());
      c->on_success = [buf = c->output, list = outs[0]] { unpack(buf, 0, list); };
    }
    return submit(c);
  }

  work gatherv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
               const gather_options& o) override {
    auto c = make_call(op_code::gatherv, "gatherv", o.timeout, {out});
    c->root = o.root_rank;
    c->input = flat(in);
    if (rank() == o.root_rank) c->output = flat(out);
    c->counts = counts;
    return submit(c);
  }

  work scatter(tensor_list& outs, std::vector<tensor_list>& ins,
               const scatter_options& o) override {
    auto c = make_call(op_code::scatterv, "scatter", o.timeout, outs);
    c->root = o.root_rank;
    c->output = flat(outs[0]);
    c->input = rank() == o.root_rank ? pack(ins[0]) : c->output;
    c->counts.assign(static_cast<std::size_t>(size()), outs[0].numel());
    return submit(c);
  }

  work scatterv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
                const scatter_options& o) override {
    auto c = make_call(op_code::scatterv, "scatterv", o.timeout, {out});
    c->root = o.root_rank;
    c->output = flat(out);
    c->input = rank() == o.root_rank ? flat(in) : c->output;
    c->counts = counts;
    return submit(c);
  }

  work reduce_scatter(tensor_list& outs, std::vector<tensor_list>& ins,
                      const reduce_scatter_options& o) override {
    auto c = make_call(op_code::reduce_scatterv, "reduce_scatter", o.timeout, outs);
    c->op = o.op;
    c->input = pack(ins[0]);
    c->output = flat(outs[0]);
    c->counts.assign(static_cast<std::size_t>(size()), outs[0].numel());
    return submit(c);
  }

  work reduce_scatter_tensor(tensor& out, tensor& in, const reduce_scatter_options& o) override {
    auto c = make_call(op_code::reduce_scatterv, "reduce_scatter_tensor", o.timeout, {out});
    c->op = o.op;
    c->input = flat(in);
    c->output = flat(out);
    c->counts.assign(static_cast<std::size_t>(size()), out.numel());
    return submit(c);
  }

  work reduce_scatterv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
                       const reduce_scatter_options& o) override {
    auto c = make_call(op_code::reduce_scatterv, "reduce_scatterv", o.timeout, {out});
    c->op = o.op;
    c->input = flat(in);
    c->output = flat(out);
    c->counts = counts;
    return submit(c);
  }

  work reduce_scatter_tensor_coalesced(tensor_list& outs, tensor_list& ins,
                                       const reduce_scatter_options& o) override {
    // Block r of the packed input is the concatenation of block r of every input.
    auto c =
        make_call(op_code::reduce_scatterv, "reduce_scatter_tensor_coalesced", o.timeout, outs);
    c->op = o.op;
    const auto per_rank = total_numel(outs);
    c->input = like(ins[0], per_rank * size());
    std::int64_t off = 0;
    for (int r = 0; r < size(); ++r)
      for (std::size_t i = 0; i < ins.size(); ++i) {
        auto m = outs[i].numel();
        c->input.flat_slice(off, m).copy_from(flat(ins[i]).flat_slice(r * m, m));
        off += m;
      }
    c->output = like(ins[0], per_rank);
    c->counts.assign(static_cast<std::size_t>(size()), per_rank);
    c->on_success = [buf = c->output, outs] { unpack(buf, 0, outs); };
    return submit(c);
  }

  work alltoall_single(tensor& out, tensor& in, const std::vector<std::int64_t>& out_splits,
                       const std::vector<std::int64_t>& in_splits,
                       const alltoall_options& o) override {
    auto c = make_call(op_code::alltoallv, "alltoall_single", o.timeout, {out});
    c->input = flat(in);
    c->output = flat(out);
    c->counts = rows_to_elements(in, in_splits);
    c->recv_counts = rows_to_elements(out, out_splits);
    return submit(c);
  }

  work alltoall(tensor_list& outs, tensor_list& ins, const alltoall_options& o) override {
    auto c = make_call(op_code::alltoallv, "alltoall", o.timeout, outs);
    c->input = pack(ins);
    c->output = like(ins[0], total_numel(outs));
    for (auto& t : ins) c->counts.push_back(t.numel());
    for (auto& t : outs) c->recv_counts.push_back(t.numel());
    c->on_success = [buf = c->output, outs] { unpack(buf, 0, outs); };
    return submit(c);
  }

  work barrier(const barrier_options& o) override {
    if (engine_) return barrier_inline(o);
    return submit(make_call(op_code::barrier, "barrier", o.timeout, {}));
  }

  work monitored_barrier(const monitored_barrier_options& o) override {
    auto c = make_call(op_code::monitored_barrier, "monitored_barrier", o.timeout, {});
    c->wait_all_ranks = o.wait_all_ranks;
    return submit(c);
  }

  work send(tensor_list& ts, int dst, const p2p_options& o) override {
    return submit_p2p(p2p_call::send, "send", dst, ts[0], o);
  }
  work recv(tensor_list& ts, int src, const p2p_options& o) override {
    return submit_p2p(p2p_call::recv, "recv", src, ts[0], o);
  }
  work recv_any_source(tensor_list& ts, const p2p_options& o) override {
    return submit_p2p(p2p_call::recv_any, "recv_any_source", -1, ts[0], o);
  }

  std::uint64_t sequence_number() override {
    return issued_.load();
  }

  void abort(const std::string& reason) override {
    caf::anon_send(group_, abort_atom::value, reason);
    if (engine_) engine_->abort(reason);
    if (messages_) messages_->abort(reason);
    if (exchange_) exchange_->abort(reason);
  }

 private:
  static tensor_list flatten(const std::vector<tensor_list>& lists) {
    tensor_list r;
    for (auto& l : lists) r.insert(r.end(), l.begin(), l.end());
    return r;
  }

  std::vector<std::int64_t> rows_to_elements(const tensor& t,
                                             const std::vector<std::int64_t>& splits) const {
    return split_elements(t, splits, size());
  }

  /// allreduce and reduce over one tensor (in place) or several (combined locally first).
  work reducing(op_code code, const char* name, const reduce_op& op, int root, int root_tensor,
                timeout_t timeout, tensor_list& ts, bool root_only) {
    auto c = make_call(code, name, timeout, ts);
    c->op = op;
    c->root = root;
    if (ts.size() == 1) {
      c->input = c->output = flat(ts[0]);
      return submit(c);
    }
    auto local_op =
        op.op() == reduce_op::AVG || op.op() == reduce_op::PREMUL_SUM ? reduce_op::SUM : op.op();
    std::vector<const void*> srcs;
    for (auto& t : ts) srcs.push_back(t.data());
    c->input = like(ts[0], ts[0].numel());
    if (on_cuda(c->input))
      combine_on_device(name, local_op, c->input, srcs);
    else
      reduce_many(c->input.scalar_type(), local_op, c->input.data(), srcs.data(), srcs.size(),
                  static_cast<std::size_t>(ts[0].numel()));
    c->output = c->input;
    c->avg_local = static_cast<std::int64_t>(ts.size());
    const bool write = !root_only || rank() == root;
    c->on_success = [buf = c->output, ts, write, root_only, root_tensor] {
      if (!write) return;
      if (root_only) {
        flat(ts[static_cast<std::size_t>(root_tensor)]).copy_from(buf);
        return;
      }
      for (auto& t : ts) flat(t).copy_from(buf);
    };
    return submit(c);
  }

  /// An allgather of this rank's `ins` packed into one block; `scatter_out`
  /// copies the gathered buffer into the caller's outputs.
  template <class F>
  work gather_blocks(const char* name, timeout_t timeout, const tensor_list& ins, F scatter_out,
                     tensor_list outputs) {
    auto c = make_call(op_code::allgatherv, name, timeout, std::move(outputs));
    c->input = ins.size() == 1 ? flat(ins[0]) : pack(ins);
    c->counts.assign(static_cast<std::size_t>(size()), c->input.numel());
    c->output = like(ins[0], c->input.numel() * size());
    c->on_success = [buf = c->output, f = std::move(scatter_out), n = size()] { f(buf, n); };
    return submit(c);
  }

  call_ptr make_call(op_code code, const char* name, timeout_t timeout, tensor_list outputs) {
    auto c = std::make_shared<collective_call>();
    c->code = code;
    c->name = name;
    c->timeout = timeout == use_group_timeout ? timeout_ : timeout;
    c->outputs = std::move(outputs);
    c->handle = work::make(name, group_name());
    return c;
  }

  work submit(call_ptr c) {
    if (on_cuda(c->input) || on_cuda(c->output)) {
      if (exchange_) return submit_on_device(c);
      c = staged_through_host(c);
    }
    // Ranks of one host: through the shared segment (ranks of one process
    // straight between their buffers).
    if (shm_ && fits_inline(*c) && fits_direct_shm(*c, size())) {
      auto op = make_direct_shm(*c);
      op->handle = c->handle;
      return on_inline(*engine_, std::move(op), c->code, c->name.c_str(),
                       c->input.defined() ? c->input : c->output, c->timeout, c->outputs);
    }
    // Messages and the group actors: float16 sums travel in float32.
    c = with_float_sums(c);
    if (auto& f = shm_ ? messages_ : engine_; f && fits_inline(*c)) {
      auto op = make_algorithm_op(*c);
      op->handle = c->handle;
      return on_inline(*f, std::move(op), c->code, c->name.c_str(), c->input, c->timeout,
                       c->outputs);
    }
    track(c->handle);
    if (debug_ == debug_level::detail) log_detail(c->handle, c->input);
    std::lock_guard<std::mutex> g{issue_mtx_};
    c->seq = number(c->handle, c->code, route::actors);
    caf::anon_send(rt_.relay(), submit_atom::value, c, group_);
    return c->handle;
  }

  /// `c` with float16/bfloat16 sums carried in float32: a ring or tree that
  /// sent partial sums in half precision would round them at every hop
  /// (3 ranks, 1 Mi float16 elements: 229k differed from the float32 sum
  /// rounded once). Two ranks reduce each element once, so stay as they are.
  call_ptr with_float_sums(const call_ptr& c) const {
    const bool sums = c->code == op_code::allreduce || c->code == op_code::reduce ||
                      c->code == op_code::reduce_scatterv;
    if (!sums || size() <= 2 || !c->input.defined() || !is_half(c->input.scalar_type())) return c;
    const auto t = c->input.scalar_type();
    auto widen = [t](const tensor& h) {
      auto f = tensor::empty({h.numel()}, dtype::float32);
      widen_to_float(t, h.data(), f.data_as<float>(), static_cast<std::size_t>(h.numel()));
      return f;
    };
    auto w = std::make_shared<collective_call>(*c);
    w->user_dtype = t;
    w->input = widen(c->input);
    w->output = c->output.is_same(c->input) ? w->input
                : c->output.defined()       ? tensor::empty({c->output.numel()}, dtype::float32)
                                            : tensor{};
    // reduce leaves the non-roots' buffers as they were.
    const bool write_back = c->code != op_code::reduce || rank() == c->root;
    w->on_success = [wide = w->output, out = c->output, then = c->on_success, write_back, t] {
      if (write_back && out.defined())
        narrow_from_float(t, wide.data_as<float>(), out.data(),
                          static_cast<std::size_t>(out.numel()));
      if (then) then();
    };
    return w;
  }

  /// The group's next sequence number, set on `w` and announced to the inline engine
  /// (under issue_mtx_, so numbers follow the order of submission).
  std::uint64_t number(const work& w, op_code code, route r) {
    const auto seq = issued_.fetch_add(1) + 1;
    w.set_sequence_number(seq);
    if (engine_) engine_->announce(seq, static_cast<std::uint8_t>(code), r);
    return seq;
  }

  /// A call on cuda tensors among ranks of this process: straight between
  /// the ranks' device buffers (backends/device_exchange.hpp).
  work submit_on_device(const call_ptr& c) {
    track(c->handle);
    if (debug_ == debug_level::detail)
      log_detail(c->handle, c->input.defined() ? c->input : c->output);
    std::lock_guard<std::mutex> g{issue_mtx_};
    c->seq = number(c->handle, c->code, route::device);
#ifdef TROUPE_HAVE_CUDA
    try {
      const auto& t = c->input.defined() ? c->input : c->output;
      exchange_->post(rank(), c, gpu::device_queue_of(rt_, t.get_device().index));
    } catch (...) {
      c->handle.fail(std::current_exception());
    }
#endif
    return c->handle;
  }

  work allreduce_inline(tensor& t, const allreduce_options& o) {
    auto data = flat(t);
    if (!shm_) {
      auto c = make_call(op_code::allreduce, "allreduce", o.timeout, {t});
      c->op = o.op;
      c->input = c->output = data;
      return on_inline(make_algorithm_op(*with_float_sums(c)), op_code::allreduce, "allreduce",
                       data, o.timeout, {t});
    }
    const double divisor = o.op.op() == reduce_op::AVG ? static_cast<double>(size()) : 0.0;
    auto kind = o.op.op() == reduce_op::AVG ? reduce_op::SUM : o.op.op();
    return on_inline(
        make_allreduce_shm(data, kind, divisor, static_cast<std::uint8_t>(op_code::allreduce)),
        op_code::allreduce, "allreduce", data, o.timeout, {t});
  }

  work barrier_inline(const barrier_options& o) {
    auto none = tensor::empty({0}, dtype::uint8);
    auto op = shm_ ? make_allreduce_shm(none, reduce_op::SUM, 0.0,
                                        static_cast<std::uint8_t>(op_code::barrier))
                   : make_algorithm_op(*make_call(op_code::barrier, "barrier", o.timeout, {}));
    return on_inline(std::move(op), op_code::barrier, "barrier", none, o.timeout, {});
  }

  /// Whether a call runs on a message engine: every collective on CPU
  /// tensors (measured 2–3× faster than the actor path from 1 MiB up, 10×
  /// below 64 KiB) but monitored_barrier, which reports the ranks that did not
  /// arrive (an actor's job). The choice depends on the op alone, so every
  /// rank makes the same one.
  static bool fits_inline(const collective_call& c) {
    auto on_cpu = [](const tensor& t) {
      return !t.defined() || t.get_device().type == device_type::cpu;
    };
    return on_cpu(c.input) && on_cpu(c.output) && c.code != op_code::monitored_barrier;
  }

  /// Issues `op` on the inline engine (with a new work unless op->handle is set).
  work on_inline(std::unique_ptr<inline_op> op, op_code code, const char* name, const tensor& data,
                 timeout_t timeout, tensor_list outputs) {
    return on_inline(*engine_, std::move(op), code, name, data, timeout, std::move(outputs));
  }

  work on_inline(inline_engine& engine, std::unique_ptr<inline_op> op, op_code code,
                 const char* name, const tensor& data, timeout_t timeout, tensor_list outputs) {
    op->name = name;
    op->timeout = timeout == use_group_timeout ? timeout_ : timeout;
    op->outputs = std::move(outputs);
    if (!op->handle.valid()) op->handle = work::make(name, group_name());
    track(op->handle);
    if (debug_ == debug_level::detail) log_detail(op->handle, data);
    std::lock_guard<std::mutex> g{issue_mtx_};
    op->seq =
        number(op->handle, code, &engine == engine_.get() && shm_ ? route::shm : route::messages);
    op->op = engine.next_op();
    return engine.submit(std::move(op));
  }

  work submit_p2p(p2p_call::kind_t kind, const char* name, int peer, const tensor& buf,
                  const p2p_options& o) {
    auto c = std::make_shared<p2p_call>();
    c->kind = kind;
    c->name = name;
    c->peer = peer;
    c->tag = o.tag;
    c->buffer = flat(buf);
    c->timeout = o.timeout == use_group_timeout ? timeout_ : o.timeout;
    c->handle = work::make(name, group_name());
    track(c->handle);
    if (debug_ == debug_level::detail) log_detail(c->handle, c->buffer);
    auto result = c->handle;
    if (on_cuda(c->buffer) && !exchange_) result = p2p_staged_through_host(*c);
    caf::anon_send(rt_.relay(), submit_atom::value, c, group_);
    return result;
  }

  /// TROUPE_DEBUG=DETAIL: one line when a call is issued and one when it ends.
  void log_detail(const work& w, const tensor& data) const {
    auto what = data.defined() ? data.describe() : std::string("no tensor");
    std::fprintf(stderr, "[troupe group '%s' rank %d] issue %s %s\n", group_name().c_str(), rank(),
                 w.op_name().c_str(), what.c_str());
    w.on_complete([r = rank()](const work& done) {
      std::fprintf(stderr, "[troupe group '%s' rank %d] %s seq %llu %s\n",
                   done.group_name().c_str(), r, done.op_name().c_str(),
                   static_cast<unsigned long long>(done.sequence_number()),
                   done.is_success() ? "done" : "FAILED");
    });
  }

  /// Remembers pending works so that destroying the group fails them instead of
  /// leaving a waiter behind.
  void track(const work& w) {
    std::lock_guard<std::mutex> g{mtx_};
    if (pending_.size() > 64)
      std::erase_if(pending_, [](auto& p) {
        auto s = p.lock();
        return !s || work_done(*s);
      });
    pending_.push_back(w.state());
  }

  static bool work_done(work_state& s) {
    std::lock_guard<std::mutex> g{s.mtx};
    return s.done;
  }

  void shutdown(const std::string& reason) {
    if (!group_) return;
    for (auto* f : {&engine_, &messages_})
      if (*f) {
        (*f)->abort(reason);
        f->reset();
      }
    if (exchange_) {
      exchange_->leave(rank(), reason);
      exchange_.reset();
    }
    in_process_directory::instance().erase(key_prefix_ + std::to_string(rank()));
    if (rt_.plane()) rt_.plane()->remove_group(group_name());
    {
      caf::scoped_actor self{rt_.system()};
      self->send_exit(group_, caf::exit_reason::user_shutdown);
    }
    group_ = nullptr;
    std::vector<std::weak_ptr<work_state>> pending;
    {
      std::lock_guard<std::mutex> g{mtx_};
      pending.swap(pending_);
    }
    for (auto& p : pending)
      if (auto s = p.lock())
        work::attach(s).fail(std::make_exception_ptr(
            error(errc::aborted, s->op + " on group '" + s->group + "' failed: " + reason)));
  }

  rank_runtime& rt_;
  timeout_t timeout_;
  debug_level debug_;
  std::string key_prefix_;
  group_actor group_;
  std::mutex mtx_;
  std::vector<std::weak_ptr<work_state>> pending_;
  std::mutex issue_mtx_;  // numbering and submission happen in one order
  std::atomic<std::uint64_t> issued_{0};
  std::shared_ptr<inline_engine> engine_;
  std::shared_ptr<inline_engine> messages_;  // beside a shared-memory engine: the other collectives
  bool shm_ = false;  // the inline engine's medium is shared memory (else the network)
  std::shared_ptr<gpu::device_exchange> exchange_;  // cuda tensors, every rank in this process
};

}  // namespace

void register_builtin_backends(std::map<std::string, registry_entry>& entries) {
  entries.emplace("actor",
                  registry_entry{[](const backend_context& ctx) -> std::shared_ptr<backend> {
                                   return std::make_shared<actor_backend>(ctx);
                                 },
                                 {device_type::cpu, device_type::cuda}});
#ifdef TROUPE_HAVE_NCCL
  // NCCL for cuda tensors (backends/nccl_backend.cpp): "cpu:actor,cuda:nccl".
  entries.emplace("nccl",
                  registry_entry{[](const backend_context& ctx) { return make_nccl_backend(ctx); },
                                 {device_type::cuda}});
#endif
}

}  // namespace troupe::detail
