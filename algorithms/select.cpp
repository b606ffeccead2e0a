// Algorithm selection: which protocol runs each call, in one place. Where a
// collective has several algorithms, the cost model (cost_model.hpp)
// predicts each one's time for the call's size, the group's ranks and where
// they live, and the fastest runs; every rank asks with the same numbers
// and so chooses the same.
//
//   allreduce        2 ranks: pair (<= 1 MiB), halves; else the fastest of
//                    ring (host by host), recursive doubling, Rabenseifner,
//                    direct (<= 16 ranks) and, across hosts, hier striped
//                    (in slices over slow links) / leaders
//   broadcast        binomial, scatter-allgather, a pipelined chain (host
//                    by host), or hier across hosts
//   allgather        ring (host by host), Bruck or recursive doubling
//                    (blocks of one size; recursive doubling: 2^k ranks),
//                    or across hosts hier striped (as many ranks on each) /
//                    leaders
//   reduce           binomial, a pipelined chain (host by host), or hier
//                    across hosts
//   gather           direct         scatter  direct
//   reduce_scatter   ring (host by host), or recursive halving, or across
//                    hosts hier striped (as many ranks on each) / leaders
//   alltoall         pairwise, or Bruck (no split sizes passed, on every rank)
//   barrier          dissemination  monitored_barrier    through rank 0

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "algorithms/algorithm.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/cost_steps.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

std::unique_ptr<algorithm> make_allreduce_ring();
std::unique_ptr<algorithm> make_allreduce_direct();
std::unique_ptr<algorithm> make_allreduce_pair();
std::unique_ptr<algorithm> make_allreduce_halves();
std::unique_ptr<algorithm> make_allreduce_recursive_doubling();
std::unique_ptr<algorithm> make_allreduce_rabenseifner();
std::unique_ptr<algorithm> make_allreduce_hier(bool striped, std::uint64_t bytes,
                                               const cost_model& m);
std::unique_ptr<algorithm> make_broadcast_binomial();
std::unique_ptr<algorithm> make_broadcast_scatter_allgather();
std::unique_ptr<algorithm> make_broadcast_hier();
std::unique_ptr<algorithm> make_broadcast_chain(bool through_leaders);
std::unique_ptr<algorithm> make_reduce_chain(bool through_leaders);
std::unique_ptr<algorithm> make_reduce_hier();
std::unique_ptr<algorithm> make_reduce_binomial();
std::unique_ptr<algorithm> make_allgather_ring();
std::unique_ptr<algorithm> make_allgather_bruck();
std::unique_ptr<algorithm> make_allgather_recursive_doubling();
std::unique_ptr<algorithm> make_allgather_hier(bool striped, std::uint64_t bytes,
                                               const cost_model& m);
std::unique_ptr<algorithm> make_gather_direct();
std::unique_ptr<algorithm> make_scatter_direct();
std::unique_ptr<algorithm> make_reduce_scatter_ring();
std::unique_ptr<algorithm> make_reduce_scatter_halving();
std::unique_ptr<algorithm> make_reduce_scatter_hier(bool striped, std::uint64_t bytes,
                                                    const cost_model& m);
std::unique_ptr<algorithm> make_alltoall_pairwise();
std::unique_ptr<algorithm> make_alltoall_bruck();
std::unique_ptr<algorithm> make_barrier_dissemination();
std::unique_ptr<algorithm> make_monitored_barrier();

namespace {

/// `bytes`: the call's input, an allgather's output (the hierarchies slice
/// large buffers, by `m`).
std::unique_ptr<algorithm> make(algorithm_kind k, std::uint64_t bytes, const cost_model& m) {
  switch (k) {
    case algorithm_kind::allreduce_direct:
      return make_allreduce_direct();
    case algorithm_kind::allreduce_pair:
      return make_allreduce_pair();
    case algorithm_kind::allreduce_halves:
      return make_allreduce_halves();
    case algorithm_kind::allreduce_recursive_doubling:
      return make_allreduce_recursive_doubling();
    case algorithm_kind::allreduce_rabenseifner:
      return make_allreduce_rabenseifner();
    case algorithm_kind::allreduce_hier_striped:
      return make_allreduce_hier(true, bytes, m);
    case algorithm_kind::allreduce_hier_leaders:
      return make_allreduce_hier(false, bytes, m);
    case algorithm_kind::broadcast_hier:
      return make_broadcast_hier();
    case algorithm_kind::broadcast_chain:
    case algorithm_kind::broadcast_chain_leaders:
      return make_broadcast_chain(k == algorithm_kind::broadcast_chain_leaders);
    case algorithm_kind::reduce_chain:
    case algorithm_kind::reduce_chain_leaders:
      return make_reduce_chain(k == algorithm_kind::reduce_chain_leaders);
    case algorithm_kind::reduce_binomial:
      return make_reduce_binomial();
    case algorithm_kind::reduce_hier:
      return make_reduce_hier();
    case algorithm_kind::allgather_bruck:
      return make_allgather_bruck();
    case algorithm_kind::allgather_recursive_doubling:
      return make_allgather_recursive_doubling();
    case algorithm_kind::broadcast_binomial:
      return make_broadcast_binomial();
    case algorithm_kind::broadcast_scatter_allgather:
      return make_broadcast_scatter_allgather();
    case algorithm_kind::allgather_ring:
      return make_allgather_ring();
    case algorithm_kind::allgather_hier_striped:
      return make_allgather_hier(true, bytes, m);
    case algorithm_kind::allgather_hier_leaders:
      return make_allgather_hier(false, bytes, m);
    case algorithm_kind::reduce_scatter_ring:
      return make_reduce_scatter_ring();
    case algorithm_kind::reduce_scatter_halving:
      return make_reduce_scatter_halving();
    case algorithm_kind::reduce_scatter_hier_striped:
      return make_reduce_scatter_hier(true, bytes, m);
    case algorithm_kind::reduce_scatter_hier_leaders:
      return make_reduce_scatter_hier(false, bytes, m);
    case algorithm_kind::alltoall_pairwise:
      return make_alltoall_pairwise();
    case algorithm_kind::alltoall_bruck:
      return make_alltoall_bruck();
    case algorithm_kind::allreduce_ring:
    case algorithm_kind::other:
      break;
  }
  return make_allreduce_ring();
}

/// TROUPE_ALGORITHMS="allreduce=ring,broadcast=hier": algorithms a user (or
/// a test) asks for by name, where they can run. A name that is not an
/// algorithm of that collective throws errc::invalid_argument.
struct forced {
  std::optional<algorithm_kind> by_code[static_cast<std::size_t>(op_code::monitored_barrier) + 1];
  const std::optional<algorithm_kind>& operator[](op_code c) const {
    return by_code[static_cast<std::size_t>(c)];
  }
};

forced parse_forced(const std::string& text) {
  forced r;
  std::size_t at = 0;
  while (at <= text.size()) {
    auto end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const auto item = text.substr(at, end - at);
    at = end + 1;
    if (item.empty()) continue;
    const auto eq = item.find('=');
    const auto op = item.substr(0, eq), name = eq == std::string::npos ? "" : item.substr(eq + 1);
    struct entry {
      const char* op;
      op_code code;
      const char* name;
      algorithm_kind kind;
    };
    static const entry known[] = {
        {"allreduce", op_code::allreduce, "direct", algorithm_kind::allreduce_direct},
        {"allreduce", op_code::allreduce, "ring", algorithm_kind::allreduce_ring},
        {"allreduce", op_code::allreduce, "recursive_doubling",
         algorithm_kind::allreduce_recursive_doubling},
        {"allreduce", op_code::allreduce, "rabenseifner", algorithm_kind::allreduce_rabenseifner},
        {"allreduce", op_code::allreduce, "hier_striped", algorithm_kind::allreduce_hier_striped},
        {"allreduce", op_code::allreduce, "hier_leaders", algorithm_kind::allreduce_hier_leaders},
        {"broadcast", op_code::broadcast, "binomial", algorithm_kind::broadcast_binomial},
        {"broadcast", op_code::broadcast, "scatter_allgather",
         algorithm_kind::broadcast_scatter_allgather},
        {"broadcast", op_code::broadcast, "hier", algorithm_kind::broadcast_hier},
        {"broadcast", op_code::broadcast, "chain", algorithm_kind::broadcast_chain},
        {"broadcast", op_code::broadcast, "chain_leaders", algorithm_kind::broadcast_chain_leaders},
        {"allgather", op_code::allgatherv, "ring", algorithm_kind::allgather_ring},
        {"allgather", op_code::allgatherv, "bruck", algorithm_kind::allgather_bruck},
        {"allgather", op_code::allgatherv, "recursive_doubling",
         algorithm_kind::allgather_recursive_doubling},
        {"allgather", op_code::allgatherv, "hier_striped", algorithm_kind::allgather_hier_striped},
        {"allgather", op_code::allgatherv, "hier_leaders", algorithm_kind::allgather_hier_leaders},
        {"reduce", op_code::reduce, "binomial", algorithm_kind::reduce_binomial},
        {"reduce", op_code::reduce, "hier", algorithm_kind::reduce_hier},
        {"reduce", op_code::reduce, "chain", algorithm_kind::reduce_chain},
        {"reduce", op_code::reduce, "chain_leaders", algorithm_kind::reduce_chain_leaders},
        {"reduce_scatter", op_code::reduce_scatterv, "ring", algorithm_kind::reduce_scatter_ring},
        {"reduce_scatter", op_code::reduce_scatterv, "halving",
         algorithm_kind::reduce_scatter_halving},
        {"reduce_scatter", op_code::reduce_scatterv, "hier_striped",
         algorithm_kind::reduce_scatter_hier_striped},
        {"reduce_scatter", op_code::reduce_scatterv, "hier_leaders",
         algorithm_kind::reduce_scatter_hier_leaders},
        {"alltoall", op_code::alltoallv, "pairwise", algorithm_kind::alltoall_pairwise},
        {"alltoall", op_code::alltoallv, "bruck", algorithm_kind::alltoall_bruck}};
    bool found = false;
    for (const auto& k : known)
      if (op == k.op && name == k.name) {
        found = true;
        r.by_code[static_cast<std::size_t>(k.code)] = k.kind;
      }
    if (!found)
      throw error(errc::invalid_argument,
                  "TROUPE_ALGORITHMS '" + text + "': '" + item +
                      "' is not COLLECTIVE=ALGORITHM (allreduce=direct|ring|recursive_doubling|"
                      "rabenseifner|hier_striped|hier_leaders, "
                      "broadcast=binomial|scatter_allgather|hier|chain|chain_leaders, "
                      "allgather=ring|bruck|recursive_doubling|hier_striped|hier_leaders, "
                      "reduce=binomial|hier|chain|chain_leaders, "
                      "reduce_scatter=ring|halving|hier_striped|hier_leaders, "
                      "alltoall=pairwise|bruck)");
  }
  return r;
}

/// The setting now: parsed again only when it changed (a process forked
/// after its first call follows its own, as the tests' children do).
/// `generation` counts this thread's parses.
const forced& forced_algorithms(std::uint64_t* generation = nullptr) {
  thread_local std::string seen;
  thread_local forced parsed;
  thread_local bool read = false;
  thread_local std::uint64_t parses = 0;
  const char* v = std::getenv("TROUPE_ALGORITHMS");
  const std::string_view now = v ? v : "";
  if (!read || now != seen) {
    parsed = parse_forced(std::string(now));
    seen = now;
    read = true;
    ++parses;
  }
  if (generation) *generation = parses;
  return parsed;
}

/// The forced algorithm where it can run on `t`, else the cost model's.
algorithm_kind pick(std::optional<algorithm_kind> want, op_code code, std::uint64_t bytes,
                    const group_topology& t, const cost_model& m, int root) {
  if (want && runs_on(*want, t) && t.size() > 2) return *want;
  return choose(code, bytes, t, m, root).kind;
}

bool even_blocks(const collective_call& call) {
  return !call.counts.empty() &&
         std::all_of(call.counts.begin(), call.counts.end(),
                     [&](std::int64_t c) { return c == call.counts.front(); });
}

/// `t`, or where an engine knows no hosts (a topology not of the group's
/// `size`) every rank on one, kept in `keep`.
const group_topology& of_size(const group_topology& t, int size,
                              std::shared_ptr<const group_topology>& keep) {
  if (t.size() == size) return t;
  keep = group_topology::flat(size);
  return *keep;
}

/// Names the algorithm byte of a call's fingerprint (base/agreement.hpp).
const bool names_algorithms = [] {
  algorithm_name = [](std::uint8_t a) -> const char* {
    return a >= 1 && a <= static_cast<int>(algorithm_kind::other) + 1
               ? to_string(static_cast<algorithm_kind>(a - 1))
               : nullptr;
  };
  return true;
}();

}  // namespace

algorithm_kind call_algorithm(const collective_call& call, const group_topology& t, int size) {
  std::shared_ptr<const group_topology> flat;
  const auto& topo = of_size(t, size, flat);
  const auto& m = t.model();
  switch (call.code) {
    case op_code::allreduce:
    case op_code::reduce_scatterv:
      return chosen_algorithm(call.code, call.input.nbytes(), topo, m);
    case op_code::broadcast:
      return chosen_algorithm(call.code, call.output.nbytes(), topo, m, call.root);
    case op_code::reduce:
      return chosen_algorithm(call.code, call.input.nbytes(), topo, m, call.root);
    case op_code::allgatherv: {
      // Blocks of different sizes: the ring, or the hierarchy where the
      // model prices it first (priced as blocks of one size).
      const auto kind = chosen_algorithm(call.code, call.output.nbytes(), topo, m);
      return even_blocks(call) || kind == algorithm_kind::allgather_hier_striped ||
                     kind == algorithm_kind::allgather_hier_leaders
                 ? kind
                 : algorithm_kind::allgather_ring;
    }
    case op_code::alltoallv:
      return call.bruck_alltoall ? algorithm_kind::alltoall_bruck
                                 : algorithm_kind::alltoall_pairwise;
    default:
      return algorithm_kind::other;
  }
}

std::unique_ptr<algorithm> make_algorithm(const collective_call& call, int, const group_topology& t,
                                          int size) {
  switch (call.code) {
    case op_code::gatherv:
      return make_gather_direct();
    case op_code::scatterv:
      return make_scatter_direct();
    case op_code::barrier:
      return make_barrier_dissemination();
    case op_code::monitored_barrier:
      return make_monitored_barrier();
    default:
      // What set_topology chose and put in the call (and its fingerprint),
      // not chosen twice.
      return make(
          call.algorithm > 0 ? static_cast<algorithm_kind>(call.algorithm - 1)
                             : call_algorithm(call, t, size),
          (call.input.defined() && call.code != op_code::allgatherv ? call.input : call.output)
              .nbytes(),
          t.model());
  }
}

algorithm_kind chosen_algorithm(op_code code, std::uint64_t bytes, const group_topology& t,
                                const cost_model& m, int root) {
  std::uint64_t generation = 0;
  const auto& want = forced_algorithms(&generation);
  // The same call on the same group chooses the same: the last choices of
  // this thread (a thread per rank) are kept, since pricing the candidates
  // costs O(n log n) at every call (0.3 ms a call at 4,096 ranks).
  struct remembered {
    std::uint64_t topology = 0, generation = 0, bytes = 0;
    op_code code = op_code::barrier;
    int root = 0;
    algorithm_kind kind = algorithm_kind::other;
  };
  thread_local remembered last[8];
  thread_local unsigned next = 0;
  const bool cacheable = t.id != 0 && &m == &t.model();
  if (cacheable)
    for (const auto& e : last)
      if (e.topology == t.id && e.generation == generation && e.bytes == bytes && e.code == code &&
          e.root == root)
        return e.kind;
  const auto kind = pick(want[code], code, bytes, t, m, root);  // other where none is chosen
  if (cacheable) last[next++ % 8] = {t.id, generation, bytes, code, root, kind};
  return kind;
}

bool alltoall_runs_bruck(const collective_call& call, const group_topology& t, int size) {
  if (call.code != op_code::alltoallv || !call.even_splits || size < 3) return false;
  std::shared_ptr<const group_topology> flat;
  return chosen_algorithm(op_code::alltoallv, call.input.nbytes(), of_size(t, size, flat),
                          t.model()) == algorithm_kind::alltoall_bruck;
}

std::unique_ptr<algorithm> make_across_hosts(const collective_call& part, int hosts,
                                             const cost_model& m) {
  const bool gathers = part.code == op_code::allgatherv;
  const auto bytes = (gathers ? part.output : part.input).nbytes();
  const auto kind = gathers && !even_blocks(part)
                        ? algorithm_kind::allgather_ring
                        : choose(part.code, bytes, *cost::one_rank_each(hosts), m).kind;
  return make(kind, bytes, m);
}

fixed_prediction predict_call(op_code code, std::uint64_t bytes, const group_topology& t,
                              const cost_model& m, const cost_model* chosen_with) {
  if (t.size() < 2) return {"none (one rank)", 0};
  const auto kind = chosen_algorithm(code, bytes, t, chosen_with ? *chosen_with : m);
  auto p = kind == algorithm_kind::other
               ? predict_fixed(code, bytes, t, m)
               : fixed_prediction{to_string(kind), predict(kind, bytes, t, m)};
  // The agreement's messages run beside the algorithm's; where ranks share
  // CPUs they contend for them as far as the ranks that wait take CPU from
  // those that work: the shorter of the two adds wait_share of its time
  // (0.5 by default: measured across emulated hosts at 2 ranks per CPU, a
  // 4-byte broadcast 82-105 us, a barrier's two rounds 73, an allreduce's
  // two hops 66-77; at 4 ranks per CPU, 510-530 us where the longer alone
  // is priced 430. On a kernel whose pollers yield to the working rank,
  // wait_share fitted 0-0.15, a broadcast's 3 hops at 4 x 2 took 900-1170
  // us where each of the two alone is priced 1150-1230, their sum 1.5
  // times that 1730-1850).
  const double agreement = agreement_time(code, t, m);
  const double contended = m.ranks_per_cpu > 1 ? m.wait_share : 0;
  p.seconds = std::max(p.seconds, agreement) + contended * std::min(p.seconds, agreement);
  return p;
}

}  // namespace troupe::detail
