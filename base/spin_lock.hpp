#pragma once
// spin_lock — a lock for critical sections of a few hundred nanoseconds that
// two threads enter at once often (a point-to-point sender matching in the
// receiver's mailbox while the receiver posts its next receive). A
// std::mutex puts the second thread to sleep at once: a futex wait and wake
// of several microseconds, which would fall into most 4-byte round trips of
// two ranks.
// This one spins briefly, then yields the CPU (the holder may be waiting for
// it when ranks outnumber cores). Never hold it across a call that may block.

#include <atomic>
#include <thread>

#include "base/futex.hpp"

namespace troupe::detail {

class spin_lock {
 public:
  void lock() noexcept {
    for (int spins = 0; held_.exchange(true, std::memory_order_acquire);)
      while (held_.load(std::memory_order_relaxed)) {
        if (++spins < 128)
          cpu_relax();
        else
          std::this_thread::yield();
      }
  }
  bool try_lock() noexcept {
    return !held_.load(std::memory_order_relaxed) &&
           !held_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

}  // namespace troupe::detail
