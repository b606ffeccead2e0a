#pragma once
// futex_lock — a mutex for sections that are mostly short and uncontended but
// now and then long (the inline engine's lock is held while a step reduces a
// chunk of a large call). Free, it costs one compare-and-swap to take and
// one exchange to release (std::mutex: a call into the threads library
// each way, about 80 instructions a pair on the issue path of a 4-byte
// collective). Contended, the taker spins briefly, then sleeps on the word
// (a spin_lock's taker would keep yielding: threads that ask the engine
// between its steps would take CPU from the ranks).
//
// The word: 0 free, 1 held, 2 held with sleepers (its release wakes one).

#include <atomic>
#include <chrono>
#include <cstdint>

#include "base/futex.hpp"

namespace troupe::detail {

class futex_lock {
 public:
  void lock() noexcept {
    std::uint32_t c = 0;
    if (!word_.compare_exchange_strong(c, 1, std::memory_order_acquire)) lock_contended(c);
  }
  bool try_lock() noexcept {
    std::uint32_t c = 0;
    return word_.compare_exchange_strong(c, 1, std::memory_order_acquire);
  }
  void unlock() noexcept {
    if (word_.exchange(0, std::memory_order_release) == 2) futex_wake(word_, 1);
  }

 private:
  void lock_contended(std::uint32_t c) noexcept {
    for (int spins = 0; spins < 100; ++spins) {
      cpu_relax();
      c = 0;
      if (word_.load(std::memory_order_relaxed) == 0 &&
          word_.compare_exchange_strong(c, 1, std::memory_order_acquire))
        return;
    }
    // Marked as having a sleeper, then asleep until released (a spurious
    // return or the timeout only looks again).
    if (c != 2) c = word_.exchange(2, std::memory_order_acquire);
    while (c != 0) {
      futex_wait(word_, 2, std::chrono::milliseconds(100));
      c = word_.exchange(2, std::memory_order_acquire);
    }
  }

  std::atomic<std::uint32_t> word_{0};
};

}  // namespace troupe::detail
