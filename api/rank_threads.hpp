#pragma once
// What run_ranks (api/testing.cpp) and simulate (api/simulation.cpp) share:
// the options of one in-process rank's world, how they end together, and the
// first rank's failure rethrown with the rank (and seed) in front.

#include <chrono>
#include <exception>
#include <memory>
#include <string>

#include "troupe/error.hpp"
#include "troupe/world.hpp"

namespace troupe::detail {

inline world_options rank_world_options(const std::shared_ptr<store>& st, int rank, int size,
                                        const std::string& backend,
                                        std::chrono::milliseconds timeout) {
  world_options o;
  o.backend = backend;
  o.store = st;
  o.rank = rank;
  o.world_size = size;
  o.timeout = timeout;
  return o;
}

/// Every rank of this process has returned from its function and leaves
/// with `w`: its groups end without telling each peer here that it left
/// (rank_runtime::leaving_together; api/world.cpp).
void leave_together(world& w) noexcept;

/// Rethrows `first` as troupe::error with `prefix` before its message (its
/// code kept; errc::internal for other exceptions).
[[noreturn]] inline void rethrow_prefixed(std::exception_ptr first, const std::string& prefix) {
  try {
    std::rethrow_exception(first);
  } catch (const error& e) {
    throw error(e.code(), prefix + e.what());
  } catch (const std::exception& e) {
    throw error(errc::internal, prefix + e.what());
  }
}

}  // namespace troupe::detail
