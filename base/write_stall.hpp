// What a write that waits on its peer does once it has waited long.
#pragma once

#include <chrono>
#include <functional>

namespace troupe::detail {

/// Called once, on the writing thread, by a write still blocked `after`
/// into it (its peer took nothing meanwhile): a call tells whom it waits
/// for before its timeout (base/wait_chain.hpp), so that a rank whose own
/// timeout comes first can follow the wait through it.
struct write_stall {
  std::chrono::steady_clock::duration after{};
  std::function<void()> tell;
};

}  // namespace troupe::detail
