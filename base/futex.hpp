#pragma once
// futex — the waiting primitives of everything that synchronizes through
// shared memory (shm rings, the inline engine): sleep on a 32-bit word until it
// changes, wake its sleepers, and the pause hint for polling loops.
// The words live in MAP_SHARED memory, so the calls use the shared (not the
// process-private) futex operations and work across processes.

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <ctime>

namespace troupe::detail {

/// Sleeps while `word` holds `expected`, at most `max` (spurious returns allowed).
inline void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                       std::chrono::nanoseconds max) {
  const auto ns = max.count() < 0 ? 0 : max.count();
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr,
            0);
}

/// Wakes up to `count` sleepers on `word` (every one by default).
inline void futex_wake(std::atomic<std::uint32_t>& word, int count = INT_MAX) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, count, nullptr, nullptr,
            0);
}

/// The spin-loop hint (lets the sibling hyperthread run).
inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

}  // namespace troupe::detail
