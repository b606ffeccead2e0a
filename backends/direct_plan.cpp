// The direct plan (see backends/direct_plan.hpp): one short function per
// collective family, each a list of steps for rank r.

#include "backends/direct_plan.hpp"

#include "base/agreement.hpp"

#include "algorithms/algorithm.hpp"
#include "kernels/reduce_kernels.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

namespace {

using calls_t = std::vector<const collective_call*>;

const void* at(const tensor& t, std::int64_t offset) {
  return static_cast<const char*>(t.data()) + static_cast<std::size_t>(offset) * t.element_size();
}
void* at_mut(const tensor& t, std::int64_t offset) {
  return const_cast<void*>(at(t, offset));
}

/// AVG divides by the ranks times the local tensors; other ops do not divide.
double divisor_of(const collective_call& c, int size) {
  if (c.op.op() != reduce_op::AVG) return 0.0;
  return static_cast<double>(size) * static_cast<double>(c.avg_local);
}

/// A reduction step over `count` elements at `in_off` of every rank's input.
plan_step reduction(const calls_t& calls, std::int64_t in_off, std::int64_t count) {
  const auto& me = *calls.front();
  plan_step s;
  s.type = me.input.scalar_type();
  const auto k = me.op.op();
  s.op = k == reduce_op::AVG || k == reduce_op::PREMUL_SUM ? reduce_op::SUM : k;
  s.count = static_cast<std::size_t>(count);
  for (auto* c : calls) {
    s.srcs.push_back(at(c->input, in_off));
    if (k == reduce_op::PREMUL_SUM) s.scales.push_back(c->op.scale());
  }
  s.divisor = divisor_of(me, static_cast<int>(calls.size()));
  return s;
}

/// A copy step of `count` elements from `src`.
plan_step copy(dtype t, const void* src, std::int64_t count) {
  plan_step s;
  s.type = t;
  s.count = static_cast<std::size_t>(count);
  s.srcs.push_back(src);
  return s;
}

void add(std::vector<plan_step>& steps, plan_step s) {
  if (s.count > 0 && !s.dsts.empty()) steps.push_back(std::move(s));
}

// allreduce: rank r reduces chunk r of every input into chunk r of every output.
std::vector<plan_step> allreduce(const calls_t& calls, int r) {
  const int n = static_cast<int>(calls.size());
  auto [off, cnt] = chunk_range(calls[0]->input.numel(), n, r);
  auto s = reduction(calls, off, cnt);
  for (auto* c : calls) s.dsts.push_back(at_mut(c->output, off));
  std::vector<plan_step> steps;
  add(steps, std::move(s));
  return steps;
}

// reduce: rank r reduces chunk r of every input into chunk r of the root's output.
std::vector<plan_step> reduce(const calls_t& calls, int r) {
  const int n = static_cast<int>(calls.size());
  const int root = calls[0]->root;
  auto [off, cnt] = chunk_range(calls[0]->input.numel(), n, r);
  auto s = reduction(calls, off, cnt);
  s.dsts.push_back(at_mut(calls[static_cast<std::size_t>(root)]->output, off));
  std::vector<plan_step> steps;
  add(steps, std::move(s));
  return steps;
}

// broadcast: rank r copies chunk r of the root's buffer into every other rank's.
std::vector<plan_step> broadcast(const calls_t& calls, int r) {
  const int n = static_cast<int>(calls.size());
  const auto& root = *calls[static_cast<std::size_t>(calls[0]->root)];
  auto [off, cnt] = chunk_range(root.input.numel(), n, r);
  auto s = copy(root.input.scalar_type(), at(root.input, off), cnt);
  for (int k = 0; k < n; ++k)
    if (k != calls[0]->root)
      s.dsts.push_back(at_mut(calls[static_cast<std::size_t>(k)]->output, off));
  std::vector<plan_step> steps;
  add(steps, std::move(s));
  return steps;
}

// allgatherv: rank r copies its input into block r of every output.
std::vector<plan_step> allgatherv(const calls_t& calls, int r) {
  const auto& me = *calls[static_cast<std::size_t>(r)];
  const auto offs = offsets_of(me.counts);
  auto s = copy(me.input.scalar_type(), at(me.input, 0), me.counts[static_cast<std::size_t>(r)]);
  for (auto* c : calls) s.dsts.push_back(at_mut(c->output, offs[static_cast<std::size_t>(r)]));
  std::vector<plan_step> steps;
  add(steps, std::move(s));
  return steps;
}

// gatherv: rank r copies its input into block r of the root's output.
std::vector<plan_step> gatherv(const calls_t& calls, int r) {
  const auto& me = *calls[static_cast<std::size_t>(r)];
  const auto offs = offsets_of(me.counts);
  auto s = copy(me.input.scalar_type(), at(me.input, 0), me.counts[static_cast<std::size_t>(r)]);
  s.dsts.push_back(
      at_mut(calls[static_cast<std::size_t>(me.root)]->output, offs[static_cast<std::size_t>(r)]));
  std::vector<plan_step> steps;
  add(steps, std::move(s));
  return steps;
}

// scatterv: rank r copies block r of the root's input into its output.
std::vector<plan_step> scatterv(const calls_t& calls, int r) {
  const auto& me = *calls[static_cast<std::size_t>(r)];
  const auto& root = *calls[static_cast<std::size_t>(me.root)];
  const auto offs = offsets_of(me.counts);
  auto s = copy(me.output.scalar_type(), at(root.input, offs[static_cast<std::size_t>(r)]),
                me.counts[static_cast<std::size_t>(r)]);
  s.dsts.push_back(at_mut(me.output, 0));
  std::vector<plan_step> steps;
  add(steps, std::move(s));
  return steps;
}

// reduce_scatterv: rank r reduces block r of every input into its output.
std::vector<plan_step> reduce_scatterv(const calls_t& calls, int r) {
  const auto& me = *calls[static_cast<std::size_t>(r)];
  const auto offs = offsets_of(me.counts);
  auto s =
      reduction(calls, offs[static_cast<std::size_t>(r)], me.counts[static_cast<std::size_t>(r)]);
  s.dsts.push_back(at_mut(me.output, 0));
  std::vector<plan_step> steps;
  add(steps, std::move(s));
  return steps;
}

// alltoallv: rank r copies its block for rank j into block r of rank j's output.
std::vector<plan_step> alltoallv(const calls_t& calls, int r) {
  const auto& me = *calls[static_cast<std::size_t>(r)];
  const auto send_offs = offsets_of(me.counts);
  std::vector<plan_step> steps;
  for (std::size_t j = 0; j < calls.size(); ++j) {
    const auto& peer = *calls[j];
    const auto recv_offs = offsets_of(peer.recv_counts);
    auto s = copy(me.input.scalar_type(), at(me.input, send_offs[j]), me.counts[j]);
    s.dsts.push_back(at_mut(peer.output, recv_offs[static_cast<std::size_t>(r)]));
    add(steps, std::move(s));
  }
  return steps;
}

}  // namespace

void check_calls_agree(const calls_t& calls) {
  std::vector<call_fingerprint> fps;
  for (auto& c : calls) fps.push_back(fingerprint_of(*c));
  if (auto why = describe_disagreement(fps); !why.empty()) throw disagreement_error(why);
}

bool needs_snapshot(const collective_call& c) {
  return c.code == op_code::alltoallv && overlaps(c.input, c.output);
}

std::vector<plan_step> direct_plan(const calls_t& calls, int rank) {
  switch (calls.front()->code) {
    case op_code::allreduce:
      return allreduce(calls, rank);
    case op_code::reduce:
      return reduce(calls, rank);
    case op_code::broadcast:
      return broadcast(calls, rank);
    case op_code::allgatherv:
      return allgatherv(calls, rank);
    case op_code::gatherv:
      return gatherv(calls, rank);
    case op_code::scatterv:
      return scatterv(calls, rank);
    case op_code::reduce_scatterv:
      return reduce_scatterv(calls, rank);
    case op_code::alltoallv:
      return alltoallv(calls, rank);
    case op_code::barrier:
    case op_code::monitored_barrier:
      return {};
  }
  return {};
}

void run_on_cpu(const std::vector<plan_step>& steps) {
  for (auto& s : steps) {
    // Sum (or fold) the scaled sources into the first destination, then copy.
    std::vector<tensor> scaled;
    std::vector<const void*> srcs;
    for (std::size_t j = 0; j < s.srcs.size(); ++j) {
      if (s.scales.empty()) {
        srcs.push_back(s.srcs[j]);
        continue;
      }
      auto t = tensor::empty({static_cast<std::int64_t>(s.count)}, s.type);
      std::memcpy(t.data(), s.srcs[j], s.count * element_size(s.type));
      scale_by(s.type, t.data(), s.count, s.scales[j]);
      srcs.push_back(t.data());
      scaled.push_back(t);
    }
    // Every source is read before a destination (which may be a source) is written.
    auto acc = tensor::empty({static_cast<std::int64_t>(s.count)}, s.type);
    reduce_many(s.type, s.op, acc.data(), srcs.data(), srcs.size(), s.count);
    if (s.divisor != 0.0) divide_by(s.type, acc.data(), s.count, s.divisor);
    for (auto* d : s.dsts) std::memcpy(d, acc.data(), s.count * element_size(s.type));
  }
}

}  // namespace troupe::detail
