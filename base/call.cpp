// The call description's names (base/call.hpp).

#include "base/call.hpp"

namespace troupe::detail {

const char* to_string(op_code c) noexcept {
  switch (c) {
    case op_code::allreduce:
      return "allreduce";
    case op_code::broadcast:
      return "broadcast";
    case op_code::reduce:
      return "reduce";
    case op_code::allgatherv:
      return "allgather";
    case op_code::gatherv:
      return "gather";
    case op_code::scatterv:
      return "scatter";
    case op_code::reduce_scatterv:
      return "reduce_scatter";
    case op_code::alltoallv:
      return "alltoall";
    case op_code::barrier:
      return "barrier";
    case op_code::monitored_barrier:
      return "monitored_barrier";
  }
  return "?";
}

}  // namespace troupe::detail
