#pragma once
/// Option structs of the ProcessGroup calls (c10d's *Options), carrying root,
/// reduce op and timeout. A timeout of zero means "the group's timeout"; a
/// negative one has expired before the call (`timeout_expired`, c10d's zero
/// timeout): the call fails at its first wait, naming what it waited for.

#include <chrono>
#include <cstdint>
#include <vector>

#include "troupe/reduce_op.hpp"

namespace troupe {

using timeout_t = std::chrono::milliseconds;
/// Use the group's default timeout.
inline constexpr timeout_t use_group_timeout{0};
/// A timeout that has already expired: e.g. a monitored_barrier on rank 0
/// that reports at once every rank that has not arrived.
inline constexpr timeout_t timeout_expired{-1};

struct broadcast_options {
  int root_rank = 0;    ///< group rank whose tensor is sent
  int root_tensor = 0;  ///< index in the root's tensor list
  timeout_t timeout = use_group_timeout;
};

struct allreduce_options {
  reduce_op op = reduce_op::SUM;
  timeout_t timeout = use_group_timeout;
};

/// c10d's AllreduceCoalescedOptions: allreduce_options' fields, written
/// `{{.op = reduce_op::MAX}}` as in c10d; process_group::allreduce_coalesced
/// also takes allreduce_options itself (`{.op = reduce_op::MAX}`).
struct allreduce_coalesced_options : allreduce_options {};

struct reduce_options {
  reduce_op op = reduce_op::SUM;
  int root_rank = 0;
  int root_tensor = 0;
  timeout_t timeout = use_group_timeout;
};

struct allgather_options {
  timeout_t timeout = use_group_timeout;
};

struct gather_options {
  int root_rank = 0;
  timeout_t timeout = use_group_timeout;
};

struct scatter_options {
  int root_rank = 0;
  timeout_t timeout = use_group_timeout;
};

struct reduce_scatter_options {
  reduce_op op = reduce_op::SUM;
  timeout_t timeout = use_group_timeout;
};

struct alltoall_options {
  timeout_t timeout = use_group_timeout;
};

struct barrier_options {
  timeout_t timeout = use_group_timeout;
  /// The CUDA devices the barrier may use (c10d's BarrierOptions::device_ids).
  /// Each must be a device this process sees, once. A backend that runs the
  /// barrier on a device (nccl) runs it on the first one, as
  /// ProcessGroupNCCL does; the actor backend's barrier moves no tensor and
  /// uses none (as Gloo's). Empty: the backend's own choice.
  std::vector<std::int64_t> device_ids{};
};

struct monitored_barrier_options {
  timeout_t timeout = use_group_timeout;
  /// Report every rank that did not arrive (true) instead of failing on the first
  /// missing rank rank 0 finds (false, c10d's default).
  bool wait_all_ranks = false;
};

struct p2p_options {
  int tag = 0;
  timeout_t timeout = use_group_timeout;
};

}  // namespace troupe
