#pragma once
// shared_copy — one large copy that several threads take part in, chunk by
// chunk.
//
// A copy of many megabytes is bound by the core that runs it (two threads
// copy it in about half the time), while the thread waiting for it has
// nothing to do. The thread that copies offers the copy to the threads
// waiting for the operations it completes (a work's help, base/work.cpp);
// each of them, and the copying thread itself, claims the next chunk nobody
// took until none is left. Nobody depends on a helper: the copying thread
// takes whatever chunk is left, so a waiter that never runs costs nothing,
// and the copy ends when the copying thread has waited for the chunks a
// helper claimed (at most one each).

#include <atomic>
#include <cstddef>

#include "base/shared_task.hpp"

namespace troupe::detail {

class shared_copy final : public shared_task {
 public:
  /// Claimed by one thread at a time: small enough that a helper joining
  /// late still takes a part, large enough that claiming costs nothing.
  static constexpr std::size_t chunk_bytes = 256 << 10;

  /// Copies `n` bytes from `src` to `dst` (the ranges do not overlap).
  shared_copy(void* dst, const void* src, std::size_t n) noexcept
      : dst_(static_cast<std::byte*>(dst)), src_(static_cast<const std::byte*>(src)), n_(n) {}
  shared_copy(const shared_copy&) = delete;
  shared_copy& operator=(const shared_copy&) = delete;

  /// Copies chunks nobody claimed until none is left; the bytes this thread
  /// copied. A helper's last access to the buffers is inside this call.
  std::size_t take_part() noexcept override;
  /// Waits (spinning, then yielding) until every claimed chunk is copied:
  /// after take_part() returned, the copy is whole once this returns.
  void wait_whole() const noexcept;
  /// Bytes copied so far (by every thread).
  std::size_t copied() const noexcept { return copied_.load(std::memory_order_acquire); }

 private:
  std::byte* dst_;
  const std::byte* src_;
  std::size_t n_;
  std::atomic<std::size_t> next_{0};    // the first byte nobody claimed
  std::atomic<std::size_t> copied_{0};  // bytes whose copy is done
};

}  // namespace troupe::detail
