#pragma once
/// Parameter synchronisation before training (torch.distributed.utils and
/// c10d's broadcast_coalesced): every rank starts from the same weights, and a
/// model that differs between ranks is found before it can hang a collective.
/// All calls are collective and block until done.

#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include "troupe/process_group.hpp"
#include "troupe/state_dict.hpp"
#include "troupe/tensor.hpp"

namespace troupe {

/// DDP's default broadcast bucket (250 MiB).
inline constexpr std::size_t default_broadcast_bucket_bytes = 250u * 1024 * 1024;

/// Broadcasts `tensors` from `src` in place, through flat buckets: the tensors
/// are grouped as compute_bucket_assignment_by_size(tensors, {bucket_bytes})
/// groups them (per dtype and device; a bucket closes once it reaches
/// bucket_bytes), and each bucket is one broadcast (a bucket of one tensor is
/// broadcast in place, without a copy). At most two buckets are in flight.
/// Every rank passes tensors of the same shapes and dtypes, contiguous.
void broadcast_coalesced(process_group& pg, const tensor_list& tensors, std::size_t bucket_bytes,
                         int src = 0);

/// c10d's _sync_params_and_buffers: broadcast_coalesced of `module_states`
/// when there are any.
void sync_params_and_buffers(process_group& pg, const tensor_list& module_states,
                             std::size_t bucket_bytes = default_broadcast_bucket_bytes,
                             int src = 0);

struct sync_module_states_options {
  std::size_t broadcast_bucket_bytes = default_broadcast_bucket_bytes;
  int src = 0;
  /// Names of parameters and buffers left alone.
  std::set<std::string> params_and_buffers_to_ignore = {};
  /// Whether buffers are sent too.
  bool broadcast_buffers = true;
};

/// c10d's _sync_module_states: the parameters (and buffers unless
/// broadcast_buffers is false) not named in the ignore set, in order, from src.
void sync_module_states(process_group& pg, const state_dict& parameters, const state_dict& buffers,
                        const sync_module_states_options& opts = {});

/// Checks that every rank has the same number of parameters with the same
/// shapes, dtypes and device types. A difference fails every rank with
/// errc::mismatch naming the rank, the parameter (index and name) and both
/// shapes. `names` (one per tensor, or none) only improves the message.
void verify_param_shapes_across_processes(process_group& pg, const tensor_list& params,
                                          const std::vector<std::string>& names = {});
/// The same for named parameters.
void verify_param_shapes_across_processes(process_group& pg, const state_dict& params);

}  // namespace troupe
