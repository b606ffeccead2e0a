#pragma once
// shm_medium — the inline engine's medium for a group whose ranks all share the
// host: the group's shared segment (inline/shm/segment.hpp). Waiting for a rank
// sleeps on that rank's bell. A rank that destroys the group sets its "left"
// flag; a rank whose process dies is seen through a pidfd (checked every few
// milliseconds while an operation is blocked).

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "inline/engine.hpp"
#include "inline/medium.hpp"
#include "inline/message_medium.hpp"
#include "memory/peer_memory.hpp"

namespace troupe::detail {

class shm_medium final : public medium {
 public:
  /// Every rank must have written its pid into `seg` already. Without
  /// `allow_direct`, ranks of one process stage through the segment as ranks
  /// of several processes do (TROUPE_ENGINE=staged, for tests and comparisons).
  shm_medium(std::unique_ptr<segment> seg, int rank, std::string group, rank_names names,
             bool allow_direct);
  ~shm_medium() override;
  /// While this process exchanges point-to-point messages with other
  /// processes, a thread waiting for this group's collectives reads them
  /// too, through `rings` (the group's message medium), as a thread
  /// waiting for a receive does (inline/mailbox.cpp): a frame that arrives
  /// meanwhile wakes no reader thread.
  void read_rings_of(std::shared_ptr<message_medium> rings) { rings_ = std::move(rings); }

  int size() const noexcept override;
  int ranks_on_host() const noexcept override { return size(); }
  reading reads_while_waiting(reading wanted) override {
    return rings_ && rings_->carries_p2p() ? rings_->reads_while_waiting(wanted) : reading::none;
  }
  bool pump(reading what) override { return rings_ && rings_->pump(what); }
  /// 2 us: the two ranks of a small collective on two CPUs find each other
  /// within one, and reading the rings from the start would slow them.
  /// With more ranks than CPUs the engine reads from the first turn (its
  /// wait policy does not spin): a rank that yields its CPU may be away
  /// long, and a frame that comes meanwhile would wake a reader thread.
  std::chrono::nanoseconds read_after() override { return std::chrono::microseconds(2); }
  void begin_wait(reading reads) override { rings_->pumping(+1, false, reads); }
  void end_wait(reading reads) override { rings_->pumping(-1, false, reads); }
  void sleep(int r, std::chrono::nanoseconds max, const std::function<bool()>& recheck,
             reading reads) override;
  std::string lost(std::uint64_t op, int blocker,
                   std::chrono::steady_clock::time_point now) override;
  void announce(std::uint64_t seq, std::uint8_t code) override;
  int announced(int r, std::uint64_t seq) override;
  void wake_all() override;
  void leave() override;
  segment* shared_segment() noexcept override { return seg_.get(); }
  bool one_process() const noexcept override { return one_process_; }
  peer_memory* peers() noexcept override { return peers_.get(); }

 private:
  std::unique_ptr<segment> seg_;
  std::shared_ptr<message_medium> rings_;  // see read_rings_of (null: none)
  int rank_;
  std::string group_;
  rank_names names_;
  bool one_process_ = false;
  std::unique_ptr<peer_memory> peers_;  // between processes: the peers' shared buffers
  std::vector<int> pidfds_;             // per rank, opened when first needed
  std::vector<int> unfinished_;         // lost()'s list, kept for its capacity
  inline_clock::time_point next_liveness_check_{};
  inline_clock::time_point next_scan_{};  // lost() reads the counters again from then
  std::int32_t my_pid_ = 0;
  // When a rank that left was first seen (no process found dead then): it is
  // named after a short grace, so that a rank that left because another one
  // died is not blamed before that death shows.
  std::optional<inline_clock::time_point> left_seen_;
};

}  // namespace troupe::detail
