#pragma once
// flight_ring — one group's flight recorder (include/troupe/flight_recorder.hpp):
// a ring of the last calls issued on the group; each call's work writes its end
// into its slot when it ends.
//
// Cost per call: no allocation (the work keeps the ring and the call's id,
// and writes the end into the call's slot if the ring has not reused it), a
// short critical section at issue and at the end, and a clock read at each;
// no strings are made until somebody reads the record.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/spin_lock.hpp"
#include "troupe/dtype.hpp"
#include "troupe/flight_recorder.hpp"

namespace troupe::detail {

class flight_ring {
 public:
  flight_ring(std::string group, int rank, int size, std::size_t capacity);

  /// Records a call issued at `issued` (the epoch: now); returns its id (for
  /// ended()). `completed`: it already completed, within the call that issued
  /// it (its peers were there first), and ends when it was issued.
  std::uint64_t record(const char* op, std::uint64_t seq, std::int64_t numel, std::uint64_t bytes,
                       dtype type, int tensors, int peer,
                       std::chrono::steady_clock::time_point issued = {}, bool completed = false);
  /// Call `id` ended (error: null when it completed); a timeout, a mismatch
  /// or a peer failure makes the ring dump itself once.
  /// `when`: when it ended (the epoch: now).
  void ended(std::uint64_t id, const std::exception_ptr& error,
             std::chrono::steady_clock::time_point when = {});
  /// The calls recorded, oldest first.
  std::vector<flight_entry> entries() const;
  /// Prints the record (stderr, or TROUPE_FLIGHT_RECORDER_DUMP/<group>-rank<R>.txt)
  /// the first time a call fails for `why`.
  void dump_once(const std::string& why);

  /// TROUPE_FLIGHT_RECORDER (default 2000 calls per group; 0: off).
  static std::size_t default_capacity();

 private:
  struct slot {
    std::uint64_t id = 0;
    const char* op = "";
    std::uint64_t seq = 0;
    std::int64_t numel = 0;
    std::uint64_t bytes = 0;
    dtype type = dtype::float32;
    int tensors = 0;
    int peer = -1;
    std::int64_t issued_us = 0;
    std::int64_t ended_us = 0;
    int state = 0;  // 0 in flight, 1 completed, 2 failed
    std::string error;
  };
  /// Microseconds since the epoch at steady time `t` (now: the epoch):
  /// steady readings moved by the offset taken at construction, so that a
  /// call's issue can reuse the reading its engine took.
  std::int64_t wall_us(std::chrono::steady_clock::time_point t = {}) const;

  std::string group_;
  int rank_, size_;
  std::int64_t wall_minus_steady_us_;
  /// Held for a slot's few stores (every call takes it twice: a std::mutex
  /// costs more than the stores).
  mutable spin_lock mtx_;
  std::size_t capacity_;
  std::vector<slot> slots_;  // grows to capacity_; call i lives in slot i % capacity_
  std::uint64_t next_ = 0;
  /// The slot of call next_ + 1 (next_ % capacity_, kept without a division:
  /// a 64-bit division costs about 40 cycles, and a call would need two).
  std::size_t at_ = 0;
  std::atomic<bool> dumped_{false};
};

}  // namespace troupe::detail
