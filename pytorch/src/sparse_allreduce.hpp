#pragma once
// allreduce of sparse COO tensors (SUM), as ProcessGroupGloo reduces them.

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <vector>

#include "troupe/process_group.hpp"

namespace troupe_torch::detail {

/// Sums `tensors` (sparse COO, all of one shape) over the ranks of `group`
/// into every one of them, in place: the local sum is coalesced, the ranks
/// gather each other's shapes and counts, then every rank's indices and
/// values, and each rank adds them up. The first gather finishes before
/// this returns (the later ones are issued with the counts it gave, in
/// issue order with the group's other calls); the rest completes the work.
c10::intrusive_ptr<c10d::Work> sparse_allreduce(troupe::process_group& group,
                                                std::vector<at::Tensor>& tensors,
                                                c10d::ReduceOp op, int rank);

}  // namespace troupe_torch::detail
