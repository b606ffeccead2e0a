// virtual_clock (virtual_clock.hpp): collectives are priced once their
// group's ranks arrived, with the algorithm the message engine would choose
// on the layout; point-to-point bytes arrive a link's time after they left.

#include "api/virtual_clock.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "api/layout_model.hpp"
#include "base/work_state.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {
namespace {

/// How the cost model sees a public call: its collective, and whether the
/// model's bytes are the ranks' sum (each rank gave its block) or the
/// largest (each rank gave the whole buffer).
struct call_model {
  const char* op;
  op_code code;
  bool summed;
};

// track()'s bytes per call (api/process_group_collectives.cpp): an
// allgather's and gather's inputs, a scatter's and reduce_scatter's
// outputs are one rank's block; the other calls give the whole buffer.
constexpr call_model models[] = {
    {"allreduce", op_code::allreduce, false},
    {"allreduce_coalesced", op_code::allreduce, false},
    {"broadcast", op_code::broadcast, false},
    {"reduce", op_code::reduce, false},
    {"allgather", op_code::allgatherv, true},
    {"allgather_into_tensor", op_code::allgatherv, true},
    {"allgather_coalesced", op_code::allgatherv, true},
    {"allgather_into_tensor_coalesced", op_code::allgatherv, true},
    {"allgatherv", op_code::allgatherv, true},
    {"gather", op_code::gatherv, true},
    {"gatherv", op_code::gatherv, true},
    {"scatter", op_code::scatterv, true},
    {"scatterv", op_code::scatterv, true},
    {"reduce_scatter", op_code::reduce_scatterv, true},
    {"reduce_scatter_tensor", op_code::reduce_scatterv, true},
    {"reduce_scatter_tensor_coalesced", op_code::reduce_scatterv, false},
    {"reduce_scatterv", op_code::reduce_scatterv, false},
    {"alltoall", op_code::alltoallv, false},
    {"alltoall_single", op_code::alltoallv, false},
    {"barrier", op_code::barrier, false},
    {"monitored_barrier", op_code::monitored_barrier, false},
};

const call_model* model_of(const char* op) {
  for (const auto& m : models)
    if (std::strcmp(m.op, op) == 0) return &m;
  return nullptr;
}

bool is_p2p(const char* op) {
  return std::strcmp(op, "send") == 0 || std::strcmp(op, "recv") == 0 ||
         std::strcmp(op, "recv_any_source") == 0 || std::strcmp(op, "batch_isend_irecv") == 0;
}

}  // namespace

virtual_clock::virtual_clock(int n, const testing::virtual_timing& timing)
    : layout_(timing.layout),
      model_(layout_model(timing.layout, timing.link_costs, "simulate: timing.layout")),
      shared_(model_.on_shared_cpus()),
      now_(static_cast<std::size_t>(n), 0.0) {
  const long long ranks = static_cast<long long>(layout_.hosts) * layout_.ranks_per_host;
  if (layout_.hosts < 1 || layout_.ranks_per_host < 1 || ranks != n)
    throw error(errc::invalid_argument,
                "simulate: timing.layout of " + std::to_string(layout_.hosts) + " hosts x " +
                    std::to_string(layout_.ranks_per_host) + " ranks does not hold the " +
                    std::to_string(n) + " ranks simulated");
}

const link_cost& virtual_clock::link(int a, int b) const {
  return a / layout_.ranks_per_host == b / layout_.ranks_per_host ? shared_.local : shared_.host;
}

void virtual_clock::issued(int rank, const std::shared_ptr<work_state>& s, const sim_call& c) {
  std::lock_guard<std::mutex> g{mtx_};
  auto world_of = [&](int group_rank) {
    return c.members.empty() ? group_rank : c.members[static_cast<std::size_t>(group_rank)];
  };
  const double t = now_[static_cast<std::size_t>(rank)];
  pending p;
  p.group = c.group;
  p.me = c.group_rank;
  p.state = s;
  if (is_p2p(c.op)) {
    auto send = [&](int peer, std::uint64_t bytes) {
      const double at = t + link(rank, world_of(peer)).time(static_cast<double>(bytes));
      in_flight_[{c.group, c.group_rank, peer}].push_back(at);
      p.sent = std::max(p.sent, at);
    };
    if (std::strcmp(c.op, "send") == 0) send(c.peer, c.bytes);
    if (std::strncmp(c.op, "recv", 4) == 0) p.recv_from = c.peer;
    for (const auto& part : c.parts) {
      if (part.send)
        send(part.peer, part.bytes);
      else
        p.recvs_from.push_back(part.peer);
    }
    keep(s, std::move(p));
    return;
  }
  // The same group's n-th collective on every rank is one call.
  const auto index = ++issued_[{c.group, rank}];
  auto& call = calls_[{c.group, index}];
  if (call.call.ranks == 0) {
    const auto* m = model_of(c.op);
    call.call.group = c.group;
    call.call.index = index;
    call.call.op = c.op;
    call.call.ranks = c.members.empty() ? 1 : static_cast<int>(c.members.size());
    call.modelled = m != nullptr;
    if (m) {
      call.code = m->code;
      call.summed = m->summed;
    }
    if (auto& topo = topologies_[c.group]; !topo) {  // the group's hosts, on the layout
      std::vector<std::string> hosts;
      for (int w : c.members) hosts.push_back(std::to_string(w / layout_.ranks_per_host));
      topo = group_topology::of_hosts(hosts);
    }
  }
  ++call.call.arrived;
  call.call.start = std::max(call.call.start, t);
  call.sum += c.bytes;
  call.most = std::max(call.most, c.bytes);
  p.call = &call;
  keep(s, std::move(p));
}

void virtual_clock::keep(const std::shared_ptr<work_state>& s, pending p) {
  auto& slot = pending_[s.get()];
  // The same work told again (a batch's operations after its first
  // telling; a when_all of calls, tracked as a call itself) keeps the
  // parts it joins. An entry of a work gone (never waited for, its address
  // now this one's) is dropped.
  if (slot.state.lock() == s) p.parts = std::move(slot.parts);
  slot = std::move(p);
}

void virtual_clock::price(collective& c) {
  if (c.priced_with == c.call.arrived) return;
  c.priced_with = c.call.arrived;
  c.call.bytes = c.summed ? c.sum : c.most;
  if (c.summed && c.call.arrived < c.call.ranks && c.call.arrived > 0)
    c.call.bytes = c.sum / static_cast<std::uint64_t>(c.call.arrived) *
                   static_cast<std::uint64_t>(c.call.ranks);  // the missing ranks' blocks alike
  if (!c.modelled) {
    c.call.algorithm = "not modelled";
    c.call.seconds = 0;
    return;
  }
  const auto& topology = *topologies_[c.call.group];
  if (c.code == op_code::alltoallv && c.call.op == "alltoall" && topology.size() > 1) {
    // The list form's tensors are its split sizes: the pairwise exchange
    // (alltoall_single is priced as without split sizes).
    c.call.algorithm = to_string(algorithm_kind::alltoall_pairwise);
    c.call.seconds = predict(algorithm_kind::alltoall_pairwise, c.call.bytes, topology, model_);
    return;
  }
  const auto p = predict_call(c.code, c.call.bytes, topology, model_);
  c.call.algorithm = p.algorithm;
  c.call.seconds = p.seconds;
}

double virtual_clock::received(const route& r, double now) {
  auto i = in_flight_.find(r);
  if (i == in_flight_.end() || i->second.empty()) return now;
  const double at = i->second.front();
  i->second.pop_front();
  return std::max(now, at);
}

void virtual_clock::waited(int rank, const work_state& s) {
  std::lock_guard<std::mutex> g{mtx_};
  auto i = pending_.find(&s);
  if (i == pending_.end()) return;  // not a call of this rank (or waited already)
  auto p = std::move(i->second);
  pending_.erase(i);
  settle(rank, p);
}

void virtual_clock::joined(int, const std::shared_ptr<work_state>& all,
                           const std::vector<const work_state*>& parts) {
  std::lock_guard<std::mutex> g{mtx_};
  pending whole;
  whole.state = all;
  for (const auto* part : parts)
    if (auto i = pending_.find(part); i != pending_.end()) {
      whole.parts.push_back(std::move(i->second));
      pending_.erase(i);
    }
  if (!whole.parts.empty()) pending_[all.get()] = std::move(whole);
}

void virtual_clock::settle(int rank, pending& p) {
  auto& clock = now_[static_cast<std::size_t>(rank)];
  for (auto& part : p.parts) settle(rank, part);
  if (p.call) {
    price(*p.call);
    clock = std::max(clock, p.call->call.start + p.call->call.seconds);
    return;
  }
  clock = std::max(clock, p.sent);
  if (p.recv_from != -2) {
    auto s = p.state.lock();
    const int from = p.recv_from >= 0 ? p.recv_from : (s ? s->source_rank : -1);
    clock = received({p.group, from, p.me}, clock);
  }
  for (int from : p.recvs_from) clock = received({p.group, from, p.me}, clock);
}

double virtual_clock::now(int rank) {
  std::lock_guard<std::mutex> g{mtx_};
  return now_[static_cast<std::size_t>(rank)];
}

void virtual_clock::compute(int rank, double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds))
    throw error(errc::invalid_argument, "virtual_compute: seconds " + std::to_string(seconds) +
                                            " must be finite and not negative");
  std::lock_guard<std::mutex> g{mtx_};
  now_[static_cast<std::size_t>(rank)] += seconds;
}

void virtual_clock::report(const testing::virtual_timing& timing) {
  std::lock_guard<std::mutex> g{mtx_};
  if (timing.calls) {
    timing.calls->clear();
    for (auto& [key, c] : calls_) {
      price(c);  // calls no rank waited for too
      timing.calls->push_back(c.call);
    }
    std::stable_sort(timing.calls->begin(), timing.calls->end(),
                     [](const testing::timed_call& a, const testing::timed_call& b) {
                       return a.start < b.start;
                     });
  }
  if (timing.ends) *timing.ends = now_;
}

}  // namespace troupe::detail
