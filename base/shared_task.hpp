#pragma once
// shared_task — work that the threads waiting for a troupe::work may take
// part in while it is pending (base/work_state.hpp's offer_help): a large
// copy between ranks of one process (kernels/shared_copy.hpp) goes faster
// when the threads waiting for its send and its receive copy too.

#include <cstddef>

namespace troupe::detail {

class shared_task {
 public:
  virtual ~shared_task() = default;
  /// Does parts nobody claimed until none is left; returns how much this
  /// thread did (bytes). A helper's last access to the task's memory is
  /// inside this call.
  virtual std::size_t take_part() noexcept = 0;
};

}  // namespace troupe::detail
