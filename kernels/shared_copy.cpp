#include "kernels/shared_copy.hpp"

#include <algorithm>
#include <cstring>
#include <thread>

#include "base/futex.hpp"
#include "kernels/stream_copy.hpp"

namespace troupe::detail {

std::size_t shared_copy::take_part() noexcept {
  // Streamed like a lent message taken between processes (inline/mailbox_loans.cpp):
  // from a quarter of the last-level cache the destination bypasses it.
  const bool stream = 4 * n_ >= stream_threshold();
  std::size_t took = 0;
  for (;;) {
    const auto at = next_.fetch_add(chunk_bytes, std::memory_order_relaxed);
    if (at >= n_) break;
    const auto count = std::min(chunk_bytes, n_ - at);
    if (stream)
      stream_copy(dst_ + at, src_ + at, count);
    else
      std::memcpy(dst_ + at, src_ + at, count);
    took += count;
    if (stream) stream_fence();  // the stores land before the count says so
    copied_.fetch_add(count, std::memory_order_release);
  }
  return took;
}

void shared_copy::wait_whole() const noexcept {
  // A helper holds at most one chunk (well under a millisecond); one that
  // lost its CPU meanwhile gets it back sooner when this thread yields.
  for (int polls = 0; copied_.load(std::memory_order_acquire) < n_; ++polls) {
    if (polls < 4096)
      cpu_relax();
    else
      std::this_thread::yield();
  }
}

}  // namespace troupe::detail
