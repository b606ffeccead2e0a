#pragma once
// What the "nccl" backend (backends/nccl_backend.cpp) needs from whatever runs
// its plans (backends/nccl_plan.hpp): the group's NCCL state (backends/nccl_group.hpp)
// on a GPU, or an emulator of NCCL's semantics on host memory in tests
// (tests/test_nccl_mapping.cpp).
//
// This header is free of CAF; it includes NCCL's header through nccl_plan.hpp.

#include <cstddef>
#include <cstdint>
#include <string>

#include "backends/nccl_plan.hpp"
#include "troupe/options.hpp"
#include "troupe/tensor.hpp"
#include "troupe/work.hpp"

namespace troupe::detail::nccl {

/// The `peer` of calls on the group's communicator (send and recv name their
/// peer instead, for the pair's communicator).
inline constexpr int whole_group = -1;

/// Runs the plans of one rank's calls on one group.
class plan_runner {
 public:
  virtual ~plan_runner() = default;

  /// Checks that every tensor is on the group's device (the first call picks it); returns it.
  virtual int bind(const char* op, const tensor_list& ts) = 0;

  /// The group's device for a call without tensors (barrier).
  virtual int bind_default(const char* op) = 0;

  /// Scratch memory of `n` elements of `t` for a call's plan on `device`
  /// (cuda memory; an emulator running plans on the host returns host memory).
  virtual tensor scratch(dtype t, std::size_t n, int device) {
    return tensor::empty({static_cast<std::int64_t>(n)}, t, device::cuda(device));
  }

  /// Issues `p` on the group's communicator (peer == whole_group) or on the
  /// pair with group rank `peer`. The work completes with `outputs` (and,
  /// for recv, `source` as its source rank).
  virtual work issue(const char* op, int peer, plan p, tensor_list outputs, timeout_t t,
                     int source = -1) = 0;

  /// How many calls were issued (the backend's sequence number).
  virtual std::uint64_t sequence() const = 0;

  /// Fails every pending call and refuses later ones.
  virtual void abort(const std::string& reason) = 0;

  /// The backend goes away: fails what is pending and releases what it holds.
  virtual void shutdown() = 0;
};

}  // namespace troupe::detail::nccl
