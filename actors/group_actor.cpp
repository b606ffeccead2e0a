// The group actor: sequence numbers, running collectives, early messages,
// point-to-point matching and aborts of one (group, rank); its state is in
// group_actor_state.hpp, its timeouts in group_actor_timeouts.cpp.

#include "actors/group_actor.hpp"

#include <algorithm>
#include <cstdio>

#include "actors/group_actor_state.hpp"
#include "actors/thread_logger.hpp"
#include "algorithms/cost_model.hpp"
#include "base/group_ranks.hpp"
#include "base/sim_conductor.hpp"
#include "base/texts.hpp"
#include "transport/frame.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {
namespace group_actor_parts {

std::string where(const group_state& st, const std::string& op, std::uint64_t seq) {
  return call_location(op, st.info.name, st.info.rank, seq);
}

/// "rank 3 (...) left group 'g' (why)": the error of a call that needs a
/// peer that left.
std::string left_text(const group_state& st, int peer, const std::string& why) {
  return left_group(st.net->describe_peer(peer), st.info.name, why);
}

void fail_op(self_ptr self, std::uint64_t seq, errc code, const std::string& cause) {
  auto& st = self->state;
  auto i = st.ops.find(seq);
  if (i == st.ops.end()) return;
  auto op = std::move(i->second);
  st.ops.erase(i);
  op.rp.deliver(make_troupe_error(static_cast<int>(code),
                                  where(st, op.call->name, seq) + " failed: " + cause));
}

void fail_everything(self_ptr self, errc code, const std::string& reason) {
  auto& st = self->state;
  st.aborted = std::make_pair(code, reason);
  std::vector<std::uint64_t> seqs;
  for (auto& kv : st.ops) seqs.push_back(kv.first);
  for (auto s : seqs) fail_op(self, s, code, reason);
  for (auto& kv : st.recvs)
    kv.second.rp.deliver(make_troupe_error(
        static_cast<int>(code), where(st, kv.second.call->name, 0) + " failed: " + reason));
  st.recvs.clear();
}

}  // namespace group_actor_parts

namespace {

using namespace group_actor_parts;

/// Whether a call moves more than 1 MiB per tensor (a write of it to a
/// peer in another process may wait for room).
bool writes_long(const collective_call& c) {
  const auto bytes = [](const tensor& t) { return t.defined() ? t.nbytes() : 0; };
  return std::max(bytes(c.input), bytes(c.output)) > (std::size_t{1} << 20);
}

void advance(self_ptr self, std::uint64_t seq) {
  auto& st = self->state;
  auto i = st.ops.find(seq);
  if (i == st.ops.end()) return;
  auto& op = i->second;
  try {
    auto& ctx = *op.ctx;
    auto describe = [&] {
      op.described = true;
      ctx.describe_to_rest();
      ctx.tell_successor();
    };
    // A large call's first writes may hold this thread up to its deadline
    // (a peer in another process that takes nothing): its peers hear what
    // it called first, so that their timeouts see it joined and name the
    // rank it waited for. A small call's fingerprint goes with its first
    // message to each peer it sends to.
    if (!op.described && writes_long(*op.call)) describe();
    // Messages of a peer whose call differs never reach the algorithm, so
    // it stops where it is; the agreement says what differs.
    if (!op.finished && !ctx.disagrees()) op.finished = op.alg->progress(ctx);
    if (!op.described) describe();
    const bool agreed = ctx.settled();  // throws when the ranks' calls differ
    if (!op.finished || !agreed) {
      // Everything a peer sent arrives before the news that it left, so a call
      // that waits for a peer that left can never finish.
      const int blocked = ctx.blocked_peer();
      if (const auto* why = st.gone.why(blocked))
        fail_op(self, seq, errc::peer_failure, left_text(st, blocked, *why));
      return;
    }
    if (op.call->on_success) op.call->on_success();
  } catch (const peer_given_up& e) {
    // Its deadline came with data a peer did not take: a timeout waiting
    // for that peer, as the inline engine says it.
    const auto what = e.what_waited();
    fail_timed_out(self, seq, "waiting for " + st.net->describe_peer(e.peer()) + " to " + what,
                   e.peer(), what);
    return;
  } catch (const error& e) {
    fail_op(self, seq, e.code(), e.what());
    return;
  } catch (const std::exception& e) {
    fail_op(self, seq, errc::internal, e.what());
    return;
  }
  auto done = std::move(i->second);
  st.ops.erase(i);
  done.rp.deliver(done.call->result());
}

/// Hands one envelope to the running op (its agreement checks what the
/// sender called).
void deliver(self_ptr self, running_op& op, std::uint64_t seq, envelope& env) {
  op.progressed = clock::now();
  try {
    op.ctx->deliver(env.src, env.step, std::move(env.payload), env.fp);
  } catch (const error& e) {
    fail_op(self, seq, e.code(), e.what());
  }
}

std::uint64_t payload_bytes(const envelope& e) {
  return e.payload.defined() ? e.payload.nbytes() : 0;
}

group_state::early_account& early_from(group_state& st, int src) {
  st.early_from.resize(static_cast<std::size_t>(st.info.size));
  return st.early_from[static_cast<std::size_t>(src)];
}

/// Keeps data for a call not made yet. A peer in another process that sent
/// more ahead than transport/frame.hpp allows is failed instead.
void keep_early(group_state& st, envelope& env) {
  auto& a = early_from(st, env.src);
  const auto n = payload_bytes(env);
  const bool next = env.seq == st.issued + 1;
  if (st.net->in_other_process(env.src)) {
    std::string why;
    if (a.messages >= max_waiting_messages)
      why = "more than " + std::to_string(max_waiting_messages) + " messages for group '" +
            st.info.name + "' that this rank has not taken yet";
    else if (!next && a.bytes - a.next_bytes + n > max_early_bytes)
      why = "more than " + std::to_string(max_early_bytes) + " bytes for calls of group '" +
            st.info.name + "' after the next one (sequence number " + std::to_string(env.seq) +
            "; this rank issued " + std::to_string(st.issued) + ")";
    if (!why.empty()) {
      st.net->reject(env.src, why);  // its gone message fails this group's calls
      return;
    }
  }
  ++a.messages;
  a.bytes += n;
  if (next) a.next_bytes += n;
  st.early[env.seq].push_back(std::move(env));
}

/// Call `seq` was issued: takes its early data (into `taken`), drops what
/// came for sequence numbers before it, and counts seq + 1 as the next.
void take_early(group_state& st, std::uint64_t seq, std::vector<envelope>& taken) {
  for (auto e = st.early.begin(); e != st.early.end() && e->first <= seq;) {
    for (auto& env : e->second) {
      auto& a = early_from(st, env.src);
      --a.messages;
      a.bytes -= payload_bytes(env);
    }
    if (e->first == seq) taken = std::move(e->second);
    e = st.early.erase(e);
  }
  for (auto& a : st.early_from) a.next_bytes = 0;
  if (auto n = st.early.find(seq + 1); n != st.early.end())
    for (auto& env : n->second) early_from(st, env.src).next_bytes += payload_bytes(env);
}

/// Answers `rp` with the abort reason if the group was aborted.
bool refused(const group_state& st, const std::string& op,
             caf::typed_response_promise<tensor_list>& rp) {
  if (!st.aborted) return false;
  rp.deliver(make_troupe_error(static_cast<int>(st.aborted->first),
                               where(st, op, 0) + " failed: " + st.aborted->second));
  return true;
}

/// Group rank `peer` is gone: fail every call that waits for it.
void peer_left(self_ptr self, int peer, const std::string& why) {
  auto& st = self->state;
  if (!st.gone.add(peer, st.info.size, why)) return;
  std::vector<std::uint64_t> seqs;
  for (auto& kv : st.ops) seqs.push_back(kv.first);
  for (auto s : seqs) advance(self, s);
  for (auto r = st.recvs.begin(); r != st.recvs.end();) {
    if (r->second.call->kind == p2p_call::recv && r->second.call->peer == peer) {
      r->second.rp.deliver(make_troupe_error(
          static_cast<int>(errc::peer_failure),
          where(st, r->second.call->name, 0) + " failed: " + left_text(st, peer, why)));
      r = st.recvs.erase(r);
    } else {
      ++r;
    }
  }
}

/// Completes a receive with a message (checking its size).
void complete_recv(group_state& st, pending_recv& r, p2p_envelope& msg) {
  auto& buf = r.call->buffer;
  if (msg.payload.nbytes() != buf.nbytes() || msg.payload.scalar_type() != buf.scalar_type()) {
    r.rp.deliver(
        make_troupe_error(static_cast<int>(errc::invalid_argument),
                          where(st, r.call->name, 0) + " failed: rank " + std::to_string(msg.src) +
                              " sent " + std::to_string(msg.payload.nbytes()) + " bytes of " +
                              std::string(to_string(msg.payload.scalar_type())) + " with tag " +
                              std::to_string(msg.tag) + ", but the receive buffer holds " +
                              std::to_string(buf.nbytes()) + " bytes of " +
                              std::string(to_string(buf.scalar_type()))));
    return;
  }
  if (buf.nbytes() > 0) buf.copy_from(msg.payload);
  r.call->source = msg.src;
  r.rp.deliver(tensor_list{buf});
}

bool matches(const p2p_call& c, const p2p_envelope& m) {
  return m.tag == c.tag && (c.kind == p2p_call::recv_any || m.src == c.peer);
}

}  // namespace

/// Data for collective call env.seq from a peer.
void on_data(self_ptr self, envelope& env) {
  auto& st = self->state;
  if (auto i = st.ops.find(env.seq); i != st.ops.end()) {
    deliver(self, i->second, env.seq, env);
    advance(self, env.seq);
  } else if (env.seq > st.issued) {
    keep_early(st, env);
  }  // else: the call already finished or failed here; drop the late message
}

/// A point-to-point message from a peer.
void on_message(self_ptr self, p2p_envelope& msg) {
  auto& st = self->state;
  for (auto i = st.recvs.begin(); i != st.recvs.end(); ++i) {
    if (!matches(*i->second.call, msg)) continue;
    auto r = std::move(i->second);
    st.recvs.erase(i);
    complete_recv(st, r, msg);
    return;
  }
  // Kept until a receive matches; a peer in another process within bounds.
  st.unmatched_from.resize(static_cast<std::size_t>(st.info.size));
  auto& a = st.unmatched_from[static_cast<std::size_t>(msg.src)];
  const auto n = msg.payload.defined() ? msg.payload.nbytes() : 0;
  if (st.net->in_other_process(msg.src) &&
      (a.messages >= max_waiting_messages || a.bytes + n > max_early_bytes)) {
    st.net->reject(msg.src, "more than " + std::to_string(max_waiting_messages) + " messages or " +
                                std::to_string(max_early_bytes) + " bytes to group '" +
                                st.info.name + "' that no receive matched yet");
    return;
  }
  ++a.messages;
  a.bytes += n;
  st.unmatched.push_back(std::move(msg));
}

/// World rank `world_rank` is gone: left with a goodbye, or crashed.
void on_gone(self_ptr self, int world_rank, const std::string& why, bool crashed) {
  const int peer =
      group_rank_of(self->state.info.global_ranks, self->state.ranks_sorted, world_rank);
  if (peer < 0) return;
  auto& st = self->state;
  if (crashed) {
    if (st.aborted) return;  // every call failed already
    st.crashed += (st.crashed.empty() ? "" : "; ") + left_text(st, peer, why);
    if (in_simulation()) {  // the conductor's schedule, not wall time
      fail_everything(self, errc::peer_failure, st.crashed);
      return;
    }
    // Named with the members that died with it (crash_grace), by on_tick.
    if (!st.crash_due) st.crash_due = clock::now() + crash_grace;
    schedule_tick(self, *st.crash_due);
  } else {
    peer_left(self, peer, why);
  }
}

/// Whether `handle` must wait for the peers (the peers_atom message that
/// follows the actor's spawn): what the data plane or a peer in this process
/// sends before it (a death it knew of, data of a peer that was quicker) is
/// kept and handled in order once the peers are there.
template <class F>
bool until_peers(self_ptr self, F handle) {
  if (self->state.net) return false;
  self->state.before_peers.emplace_back(std::move(handle));
  return true;
}

group_actor spawn_group_actor(caf::actor_system& sys, group_info info) {
  thread_logger_release release;  // the caller's thread: see actors/thread_logger.hpp
  return sys.spawn([info = std::move(info)](self_ptr self) -> group_actor::behavior_type {
    self->state.info = info;
    self->state.ranks_sorted = std::is_sorted(info.global_ranks.begin(), info.global_ranks.end());
    // An exception escaping a handler would kill this actor and strand every
    // caller; report it instead and keep the group alive.
    self->set_exception_handler([self](std::exception_ptr& eptr) -> caf::error {
      std::string what = "unknown exception";
      try {
        std::rethrow_exception(eptr);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      std::fprintf(stderr, "[troupe group '%s' rank %d] internal error in a handler: %s\n",
                   self->state.info.name.c_str(), self->state.info.rank, what.c_str());
      return caf::none;
    });
    // A peer that goes away takes the group with it: fail what is pending.
    return {
        [self](run_atom, call_ptr call) -> caf::typed_response_promise<tensor_list> {
          auto& st = self->state;
          auto rp = self->make_response_promise<tensor_list>();
          if (refused(st, call->name, rp)) return rp;
          // Numbered at issue (the shared-memory engine takes numbers too, so
          // the actor sees gaps, the same on every rank).
          const auto seq = call->seq;
          st.issued = seq;
          auto& op = st.ops[seq];
          op.progressed = clock::now();
          op.deadline = op.progressed + call->timeout;
          op.call = call;
          op.rp = rp;
          op.ctx = std::make_unique<actor_op_context>(st.info.rank, st.info.size, *call, seq,
                                                      *st.net, op.deadline,
                                                      in_simulation() ? nullptr : st.info.waits);
          // The group actors run the algorithms for ranks on one host (they
          // carry TROUPE_ENGINE=actors and monitored_barrier, not speed).
          if (!st.topology)
            st.topology =
                group_topology::flat(st.info.size, cost_model::of_measured(st.info.link_costs));
          op.ctx->set_topology(st.topology);
          op.alg = make_algorithm(*call, st.info.rank, *st.topology, st.info.size);
          std::vector<envelope> msgs;
          take_early(st, seq, msgs);
          if (!msgs.empty()) {
            for (auto& env : msgs) {
              if (!st.ops.count(seq)) break;
              deliver(self, st.ops[seq], seq, env);
            }
            if (!st.ops.count(seq)) return rp;
          }
          schedule_tick(self, told_early_at(op));
          advance(self, seq);
          return rp;
        },
        [self](p2p_atom, p2p_ptr call) -> caf::typed_response_promise<tensor_list> {
          auto& st = self->state;
          auto rp = self->make_response_promise<tensor_list>();
          if (refused(st, call->name, rp)) return rp;
          if (const auto* why = st.gone.why(call->peer); why && call->kind != p2p_call::recv_any) {
            const bool waiting = std::none_of(st.unmatched.begin(), st.unmatched.end(),
                                              [&](auto& m) { return matches(*call, m); });
            if (call->kind == p2p_call::send || waiting) {
              rp.deliver(make_troupe_error(
                  static_cast<int>(errc::peer_failure),
                  where(st, call->name, 0) + " failed: " + left_text(st, call->peer, *why)));
              return rp;
            }
          }
          if (call->kind == p2p_call::send) {
            // Eager send: the caller's buffer is free once this returns (a
            // private copy for peers that read the payload later).
            auto payload =
                st.net->reads_after_send(call->peer) ? call->buffer.clone() : call->buffer;
            const auto why =
                st.net->send(call->peer, p2p_envelope{st.info.rank, call->tag, std::move(payload)},
                             clock::now() + call->timeout);
            if (why.empty())
              rp.deliver(tensor_list{call->buffer});
            else
              rp.deliver(make_troupe_error(
                  static_cast<int>(errc::peer_failure),
                  where(st, call->name, 0) + " failed: " + left_text(st, call->peer, why)));
            return rp;
          }
          pending_recv r{clock::now() + call->timeout, call, rp};
          for (auto i = st.unmatched.begin(); i != st.unmatched.end(); ++i) {
            if (!matches(*call, *i)) continue;
            auto msg = std::move(*i);
            st.unmatched.erase(i);
            auto& a = st.unmatched_from[static_cast<std::size_t>(msg.src)];
            --a.messages;
            a.bytes -= msg.payload.defined() ? msg.payload.nbytes() : 0;
            complete_recv(st, r, msg);
            return rp;
          }
          const auto id = ++st.next_recv;
          schedule_tick(self, r.deadline);
          st.recvs.emplace(id, std::move(r));
          return rp;
        },
        [self](data_atom, envelope& env) {
          if (!until_peers(self, [self, env]() mutable { on_data(self, env); })) on_data(self, env);
        },
        [self](msg_atom, p2p_envelope& msg) {
          if (!until_peers(self, [self, msg]() mutable { on_message(self, msg); }))
            on_message(self, msg);
        },
        [self](timeout_atom) { on_tick(self); },
        [self](gone_atom, int world_rank, std::string& why, bool crashed) {
          if (!until_peers(self, [=] { on_gone(self, world_rank, why, crashed); }))
            on_gone(self, world_rank, why, crashed);
        },
        [self](abort_atom, std::string& reason) { fail_everything(self, errc::aborted, reason); },
        [self](peers_atom, std::shared_ptr<actor_peers>& net) {
          auto& st = self->state;
          st.net = std::move(net);
          auto peers = st.net->watch_list();
          // Whatever ends this actor, tell the peers in this process that this
          // rank left, as the data plane's goodbye does for other processes.
          // Not a CAF monitor: CAF 0.17 delivers a down message in the context
          // of the dying actor, which schedules the peer on the dying rank's
          // scheduler, and that actor system's shutdown then kills the peer.
          // anon_send schedules the peer in its own actor system.
          const int me = st.info.global_ranks[static_cast<std::size_t>(st.info.rank)];
          self->attach_functor([peers, me, rank = st.info.rank,
                                together = st.info.leaving_together](const caf::error&) {
            if (together && together->load()) return;  // every peer here ends too
            for (std::size_t r = 0; r < peers->size(); ++r)
              if (static_cast<int>(r) != rank && (*peers)[r])
                if (auto a = caf::actor_cast<caf::actor>((*peers)[r]))
                  caf::anon_send(a, gone_atom::value, me, std::string("its world ended"), false);
          });
          auto kept = std::move(st.before_peers);
          for (auto& handle : kept) handle();
          return true;
        },
    };
  });
}

}  // namespace troupe::detail
