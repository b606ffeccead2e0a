// host_backend (host_backend.hpp) coordinates its (group, rank): where each
// call runs, and the one path every collective leaves by.
//
// Routes (inline/engine.hpp's route): `shm`, the inline engine's operations
// on the shared segment (every rank of the group on this host); `messages`,
// the inline engine's message algorithms (algorithms/, between hosts and for
// what the segment does not run); `device`, the device exchange (cuda
// tensors, every rank in this process); `actors`, the group actors
// (monitored_barrier, TROUPE_ENGINE=actors). A planned call takes the route
// choose() gives it (submit); the one-tensor calls host_plan.cpp keeps off
// planning go to the segment or its tiny lane directly (on_segment, on_tiny).
// Every one of them leaves through issue(): its sequence number, announced
// with its route (a rank blocked on one engine can then tell a peer that
// issued the same number on another), then the route's engine.

#include "backends/host_backend.hpp"

#include <algorithm>
#include <cstdio>

#include "actors/rank_runtime.hpp"
#include "backends/cuda_staging.hpp"
#include "backends/device_exchange.hpp"
#include "backends/flat_buffers.hpp"
#include "base/callback_pool.hpp"
#include "base/work_state.hpp"
#include "inline/algorithm_op.hpp"
#include "inline/mailbox.hpp"
#include "inline/shm/allreduce_shm.hpp"
#include "inline/shm/direct_shm.hpp"
#include "inline/shm/tiny_direct.hpp"
#include "kernels/reduce_kernels.hpp"
#include "memory/recycled.hpp"
#ifdef TROUPE_HAVE_CUDA
#include "actors/device_actor.hpp"
#include "cuda/device_ops.hpp"
#endif

namespace troupe::detail {

route host_backend::choose(const collective_call& c) const {
  if (on_cuda(c.input) || on_cuda(c.output)) return route::device;
  if (!fits_inline(c)) return route::actors;
  if (shm_ && fits_direct_shm(c, size())) return route::shm;
  return (shm_ ? messages_ : engine_) ? route::messages : route::actors;
}

work host_backend::submit(collective_call&& c) {
  // cuda tensors of ranks in several processes: a CPU call on host copies.
  if (!exchange_ && (on_cuda(c.input) || on_cuda(c.output))) {
    if (!c.handle.valid()) c.handle = make_work(c.name, group_name());
    c = staged_through_host(c);
  }
  switch (choose(c)) {
    case route::shm: {
      // Straight between the ranks' buffers: the call moves into its operation.
      const auto code = c.code;
      const auto* name = c.name;
      const auto timeout = c.timeout;
      auto outputs = std::move(c.outputs);
      auto sole = std::move(c.sole_output);
      auto handle = std::move(c.handle);  // the operation's own; the call keeps none
      // The data only for the detail log (the call moves into the operation).
      const tensor logged =
          debug_ == debug_level::detail ? (c.input.defined() ? c.input : c.output) : tensor{};
      auto op = make_direct_shm(std::move(c));
      op->handle = std::move(handle);
      op->sole_output = std::move(sole);
      auto& o = *op;
      return to_engine(*engine_, route::shm, o, std::move(op), code, name, logged, timeout,
                       std::move(outputs));
    }
    case route::messages: {
      // float16 sums travel in float32.
      auto p = with_float_sums(std::make_shared<collective_call>(std::move(c)));
      auto op = make_algorithm_op(p);
      op->handle = p->handle;
      op->sole_output = p->sole_output;
      auto& o = *op;
      return to_engine(shm_ ? *messages_ : *engine_, route::messages, o, std::move(op), p->code,
                       p->name, p->input, p->timeout, p->outputs);
    }
    case route::device:
      return on_device(std::make_shared<collective_call>(std::move(c)));
    case route::actors:
      return on_actors(with_float_sums(std::make_shared<collective_call>(std::move(c))));
  }
  return {};
}

template <class Hand>
work host_backend::issue(op_code code, route r, Hand&& hand) {
  std::lock_guard<futex_lock> g{issue_mtx_};
  // The lock orders the writers: a store, not a locked add.
  const auto seq = issued_.load(std::memory_order_relaxed) + 1;
  issued_.store(seq, std::memory_order_release);
  if (engine_) engine_->announce(seq, static_cast<std::uint8_t>(code), r);
  return hand(seq);
}

/// The call's work (made here for the routes whose engine makes none),
/// tracked and logged as it is issued.
work host_backend::issued_work(collective_call& c, const tensor& data) {
  if (!c.handle.valid()) c.handle = make_work(c.name, group_name());
  track(c.handle);
  if (debug_ == debug_level::detail) log_detail(c.handle, data);
  return c.handle;
}

/// A call on cuda tensors among ranks of this process: straight between
/// the ranks' device buffers (backends/device_exchange.hpp).
work host_backend::on_device(const call_ptr& c) {
  issued_work(*c, c->input.defined() ? c->input : c->output);
  return issue(c->code, route::device, [&](std::uint64_t seq) {
    c->seq = seq;
    c->handle.set_sequence_number(seq);
#ifdef TROUPE_HAVE_CUDA
    try {
      const auto& t = c->input.defined() ? c->input : c->output;
      exchange_->post(rank(), c, gpu::device_queue_of(rt_, t.get_device().index));
    } catch (...) {
      c->handle.fail(std::current_exception());
    }
#endif
    return c->handle;
  });
}

/// A call the group actors run (actors/group_actor.cpp), through the relay.
work host_backend::on_actors(const call_ptr& c) {
  issued_work(*c, c->input);
  return issue(c->code, route::actors, [&](std::uint64_t seq) {
    c->seq = seq;
    c->handle.set_sequence_number(seq);
    caf::anon_send(rt_.relay(), submit_atom::value, c, group_);
    return c->handle;
  });
}

/// `c` with float16/bfloat16 sums carried in float32: a ring or tree that
/// sent partial sums in half precision would round them at every hop
/// (3 ranks, 1 Mi float16 elements: 229k differed from the float32 sum
/// rounded once). Two ranks reduce each element once, so stay as they are.
call_ptr host_backend::with_float_sums(const call_ptr& c) const {
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

work host_backend::allreduce_inline(tensor& t, const allreduce_options& o) {
  if (!shm_) {
    auto data = flat(t);
    auto c =
        std::make_shared<collective_call>(make_call(op_code::allreduce, "allreduce", o.timeout, t));
    c->op = o.op;
    c->input = c->output = data;
    auto op = make_algorithm_op(with_float_sums(c));
    op->sole_output = t;
    auto& r = *op;
    return to_engine(*engine_, route::messages, r, std::move(op), op_code::allreduce, "allreduce",
                     data, o.timeout, {});
  }
  return on_segment(op_code::allreduce, "allreduce", t, o.op, -1, o.timeout);
}

work host_backend::on_segment(op_code code, const char* name, tensor& t, const reduce_op& op,
                              int root, timeout_t timeout) {
  const double divisor = op.op() == reduce_op::AVG ? static_cast<double>(size()) : 0.0;
  auto kind = op.op() == reduce_op::AVG ? reduce_op::SUM : op.op();
  // The flat view goes into the operation (not copied: every tensor copy
  // counts its two owners up and down, a locked instruction each); a tensor
  // that is flat already is the output too.
  const bool whole = is_flat(t);
  auto shm_op =
      make_allreduce_shm(flat(t), kind, divisor, static_cast<std::uint8_t>(code), root, whole);
  if (!whole) shm_op->sole_output = t;
  auto& r = *shm_op;
  return to_engine(*engine_, route::shm, r, std::move(shm_op), code, name, t, timeout, {});
}

bool host_backend::on_tiny_lane(op_code code, const tensor& block, const tensor& other,
                                const tensor_list& root_list) const {
  return engine_ && shm_ && on_cpu_or_none(block) && on_cpu_or_none(other) &&
         std::all_of(root_list.begin(), root_list.end(), on_cpu_or_none) &&
         fits_tiny_direct(code, block.nbytes(), size());
}

work host_backend::on_tiny(tiny_call c, const char* name, timeout_t timeout, const tensor& sole,
                           tensor_list outputs) {
  const tensor logged = debug_ == debug_level::detail ? (c.input ? *c.input : *c.output) : tensor{};
  // `c.output` is flat(sole) where sole is defined: a tensor flat already
  // is the output itself.
  const bool whole = is_flat(sole);
  c.output_is_result = whole;
  tiny_direct op{c};
  if (!whole) op.sole_output = sole;
  return to_engine(*engine_, route::shm, op, nullptr, c.code, name, logged, timeout,
                   std::move(outputs));
}

work host_backend::barrier_inline(const barrier_options& o) {
  // No data: one empty tensor for every barrier of the process (immutable).
  static const tensor none = tensor::empty({0}, dtype::uint8);
  auto op = shm_ ? make_allreduce_shm(none, reduce_op::SUM, 0.0,
                                      static_cast<std::uint8_t>(op_code::barrier))
                 : make_algorithm_op(std::make_shared<collective_call>(
                       make_call(op_code::barrier, "barrier", o.timeout, tensor_list{})));
  auto& r = *op;
  return to_engine(*engine_, shm_ ? route::shm : route::messages, r, std::move(op),
                   op_code::barrier, "barrier", none, o.timeout, {});
}

/// Whether a call runs on a message engine: every collective on CPU
/// tensors (the waiting threads run it, without the actor path's hops)
/// but monitored_barrier, which reports the ranks that did not
/// arrive (an actor's job). The choice depends on the op alone, so every
/// rank makes the same one.
bool host_backend::fits_inline(const collective_call& c) {
  return on_cpu_or_none(c.input) && on_cpu_or_none(c.output) &&
         c.code != op_code::monitored_barrier;
}

work host_backend::to_engine(inline_engine& engine, route r, inline_op& op,
                             std::unique_ptr<inline_op> owned, op_code code, const char* name,
                             const tensor& data, timeout_t timeout, tensor_list outputs) {
  op.name = name;
  op.timeout = timeout == use_group_timeout ? timeout_ : timeout;
  op.outputs = std::move(outputs);
  // Not tracked: the engine holds the operation until it ends, and aborting
  // the engine (abort, shutdown) fails it. Its work is made by the engine
  // once this rank posted (inline_engine::submit), but for the log.
  if (debug_ == debug_level::detail) {
    if (!op.handle.valid()) op.handle = make_work(name, group_name());
    log_detail(op.handle, data);
  }
  return issue(code, r, [&](std::uint64_t seq) {
    op.seq = seq;
    if (op.handle.valid()) op.handle.set_sequence_number(seq);
    op.op = engine.next_op();
    return owned ? engine.submit(std::move(owned)) : engine.submit_borrowed(op);
  });
}

work host_backend::submit_p2p(p2p_call::kind_t kind, const char* name, int peer, const tensor& buf,
                              const p2p_options& o) {
  p2p_call c;
  c.kind = kind;
  c.name = name;
  c.peer = peer;
  c.tag = o.tag;
  c.buffer = flat(buf);
  c.timeout = o.timeout == use_group_timeout ? timeout_ : o.timeout;
  c.handle = make_work(name, group_name());
  // The mailbox fails what it holds when the group ends (mailbox::leave):
  // only the group actor's calls are tracked here.
  if (!mailbox_) track(c.handle);
  if (debug_ == debug_level::detail) log_detail(c.handle, c.buffer);
  auto result = c.handle;
  if (on_cuda(c.buffer) && !exchange_) result = p2p_staged_through_host(c);
  if (mailbox_)
    mailbox_->post(std::move(c));
  else
    caf::anon_send(rt_.relay(), submit_atom::value, std::make_shared<p2p_call>(std::move(c)),
                   group_);
  return result;
}

work host_backend::batch_isend_irecv(std::vector<p2p_op>& ops) {
  std::vector<work> parts;
  parts.reserve(ops.size());
  auto issue = [&](const p2p_op& op) {
    const p2p_options o{.tag = op.tag};
    return op.kind == p2p_op::isend ? submit_p2p(p2p_call::send, "send", op.peer, op.buffer, o)
                                    : submit_p2p(p2p_call::recv, "recv", op.peer, op.buffer, o);
  };
  const bool host =
      std::none_of(ops.begin(), ops.end(), [](const p2p_op& op) { return on_cuda(op.buffer); });
  if (!mailbox_ || !host || debug_ == debug_level::detail) {
    for (auto& op : ops) parts.push_back(issue(op));
    return join(make_work("batch_isend_irecv", group_name()), std::move(parts));
  }
  // The whole completes with every op's buffer (each part's output). A small
  // send to a rank of another process is written here and done: no work of
  // its own (a work made, completed, joined and destroyed costs such a send
  // about a thousand instructions).
  tensor_list outputs;
  outputs.reserve(ops.size());
  // Meanwhile the peers' frames wait in their rings for this thread (read at
  // the end, into the receives posted here) instead of waking a reader.
  struct issuing {
    mailbox& m;
    explicit issuing(mailbox& mb) : m(mb) { m.issuing(+1); }
    ~issuing() { m.issuing(-1); }
  } scope{*mailbox_};
  // Receives from ranks of other processes share one work and count down
  // together (a work per receive made, joined, completed and destroyed costs
  // about 700 instructions each).
  work received;
  std::shared_ptr<receive_count> count;
  auto call_of = [&](const p2p_op& op) {
    p2p_call c;
    c.kind = op.kind == p2p_op::isend ? p2p_call::send : p2p_call::recv;
    c.name = op.kind == p2p_op::isend ? "send" : "recv";
    c.peer = op.peer;
    c.tag = op.tag;
    c.buffer = outputs.back();
    c.timeout = timeout_;
    return c;
  };
  for (auto& op : ops) {
    outputs.push_back(flat(op.buffer));
    if (op.kind == p2p_op::irecv && mailbox_->in_other_process(op.peer)) {
      if (!count) {
        received = make_work("batch_isend_irecv", group_name());
        count = std::allocate_shared<receive_count>(recycling_allocator<receive_count>{});
      }
      auto c = call_of(op);
      c.handle = received;
      c.count = count;
      count->left.fetch_add(1, std::memory_order_relaxed);
      mailbox_->post(std::move(c));
      continue;
    }
    if (op.kind == p2p_op::isend) {
      if (std::exception_ptr failed; mailbox_->send_now(call_of(op), failed)) {
        if (failed) {
          auto w = make_work("send", group_name());
          w.fail(failed);
          parts.push_back(std::move(w));
        }
        continue;
      }
    }
    parts.push_back(issue(op));
  }
  if (!count)
    return join(make_work("batch_isend_irecv", group_name()), std::move(parts), std::move(outputs));
  // Only the receives have a work: theirs completes with every op's buffer.
  work whole = received;
  if (parts.empty()) {
    count->outputs = std::move(outputs);
  } else {
    parts.push_back(received);
    whole =
        join(make_work("batch_isend_irecv", group_name()), std::move(parts), std::move(outputs));
  }
  // The batch's own count: the last receive may have come already.
  if (count->left.fetch_sub(1, std::memory_order_acq_rel) == 1)
    complete_in_pool(received, std::move(count->outputs));
  return whole;
}

}  // namespace troupe::detail
