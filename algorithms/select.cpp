// Algorithm selection: which protocol runs each op code. One place to grow
// size- and rank-count-dependent choices (trees for small messages, rings
// for large ones) as the performance work adds algorithms.

#include "algorithms/algorithm.hpp"

namespace troupe::detail {

std::unique_ptr<algorithm> make_allreduce_ring();
std::unique_ptr<algorithm> make_allreduce_direct();
std::unique_ptr<algorithm> make_allreduce_pair();
std::unique_ptr<algorithm> make_allreduce_halves();
std::unique_ptr<algorithm> make_broadcast_binomial();
std::unique_ptr<algorithm> make_reduce_binomial();
std::unique_ptr<algorithm> make_allgather_ring();
std::unique_ptr<algorithm> make_gather_direct();
std::unique_ptr<algorithm> make_scatter_direct();
std::unique_ptr<algorithm> make_reduce_scatter_ring();
std::unique_ptr<algorithm> make_alltoall_pairwise();
std::unique_ptr<algorithm> make_barrier_dissemination();
std::unique_ptr<algorithm> make_monitored_barrier();

/// Up to this many bytes, an allreduce sends every contribution to every rank
/// in one step (allreduce_direct) instead of running the ring: latency, not
/// bandwidth, decides small collectives.
constexpr std::size_t direct_allreduce_bytes = 64 * 1024;
/// Above this many bytes, two ranks each reduce half (allreduce_halves):
/// half the reduction work, done by the receiving thread between processes.
constexpr std::size_t halves_allreduce_bytes = std::size_t{1} << 20;

std::unique_ptr<algorithm> make_algorithm(const collective_call& call, int, int size) {
  switch (call.code) {
    case op_code::allreduce:
      // Two ranks: one pipelined exchange (the ring's volume in one phase)
      // up to 1 MiB, each rank reducing half beyond; more: one step while
      // latency decides, the ring beyond.
      if (size == 2)
        return call.input.nbytes() > halves_allreduce_bytes ? make_allreduce_halves()
                                                            : make_allreduce_pair();
      return size > 1 && call.input.nbytes() <= direct_allreduce_bytes ? make_allreduce_direct()
                                                                       : make_allreduce_ring();
    case op_code::broadcast:
      return make_broadcast_binomial();
    case op_code::reduce:
      return make_reduce_binomial();
    case op_code::allgatherv:
      return make_allgather_ring();
    case op_code::gatherv:
      return make_gather_direct();
    case op_code::scatterv:
      return make_scatter_direct();
    case op_code::reduce_scatterv:
      return make_reduce_scatter_ring();
    case op_code::alltoallv:
      return make_alltoall_pairwise();
    case op_code::barrier:
      return make_barrier_dissemination();
    case op_code::monitored_barrier:
      return make_monitored_barrier();
  }
  return nullptr;
}

}  // namespace troupe::detail
