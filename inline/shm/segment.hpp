#pragma once
// segment — the shared memory through which the ranks of one group on one
// host run collectives without messages (see inline/engine.hpp).
//
// Layout (every region starts on its own cache line or page):
//  - per rank, its bell: a futex word that ranks waiting for this rank sleep
//    on, and the count of its sleepers, so that publishing a counter makes a
//    system call only when somebody sleeps, and wakes only those waiting for
//    this rank (with more ranks than cores, waking everyone on every step
//    costs more than the step);
//  - per rank, written only by that rank: its progress counters (one cache
//    line), the descriptors of its last two operations, its pid and "left"
//    flag, and the ring of the kinds of its last 64 collectives (announce);
//  - per rank, two tiny lanes (operation parity): a header line and
//    tiny_lane_bytes of data after it (inline/shm/shm_op.hpp: a collective
//    whose every source fits 1 KiB posts everything a peer needs there, so
//    that a peer reads one line to learn that it was posted and what it is;
//    alltoall its input first, then its counts);
//  - per rank, two slots of an alltoall's send and receive counts, 2n
//    each (operation parity): room for any group, without taking the
//    small-message slots (32 KiB would hold them for 2048 ranks);
//  - per rank, two small-message slots (operation parity);
//  - per rank, `chunk_slots` staging slots of `chunk_bytes`, and one shared
//    ring of result slots of the same shape. Every data slot starts half a
//    page into a page (page-aligned buffers would stall on 4 KiB aliasing).
// Counters grow monotonically and are never reset, so a flag never needs
// clearing: "rank r reached step x" is `counter[r] >= x`.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace troupe::detail {

struct segment_shape {
  int size = 1;                         ///< ranks in the group
  std::size_t small_bytes = 32 << 10;   ///< largest buffer sent in one step
  std::size_t chunk_bytes = 256 << 10;  ///< staging granularity for larger buffers
  int chunk_slots = 4;                  ///< chunks in flight
};

/// The shape a group of `size` ranks uses. Two ranks take private buffers up
/// to 1 MiB through the slots (faster than staging them in chunks); more
/// ranks read n slots each, so only up to 32 KiB.
/// Shared buffers above 32 KiB skip the slots (inline/shm/allreduce_shm).
segment_shape shape_for(int size);

/// What an operation looks like; every rank must pass the same.
struct op_descriptor {
  std::uint64_t op = 0;   ///< inline operation number (1, 2, ...)
  std::uint64_t seq = 0;  ///< the group's sequence number
  std::uint64_t nbytes = 0;
  std::uint32_t dtype = 0;
  std::uint32_t reduce = 0;
  std::uint32_t code = 0;      ///< which collective (op_code)
  std::int32_t share_fd = -1;  ///< the buffer's memfd in its process (tensor::empty_shared)
  std::uint64_t addr = 0;      ///< the buffer's address (read only by ranks in the same process)
  /// A shared buffer (share_id != 0): its allocation number, the allocation's
  /// size and the buffer's offset in it; peers map it (memory/peer_memory).
  std::uint64_t share_id = 0;
  std::uint64_t share_size = 0;
  std::uint64_t share_offset = 0;
  std::int32_t root = 0;          ///< rooted collectives (direct_shm)
  std::uint64_t counts_hash = 0;  ///< the elements per rank, hashed (direct_shm)
  /// A gather's root: its output's bytes, when it offers its output for the
  /// others to write their blocks into (between processes the share fields
  /// describe it, in one process `out_addr` holds it); else 0.
  std::uint64_t out_nbytes = 0;
  std::uint64_t out_addr = 0;
};

/// Progress counters of one rank (written by it alone).
struct alignas(64) rank_progress {
  std::atomic<std::uint64_t> arrived{
      0};  ///< last operation whose descriptor (and small data) is posted
  std::atomic<std::uint64_t> done{0};      ///< last operation this rank finished reading for
  std::atomic<std::uint64_t> staged{0};    ///< last chunk staged
  std::atomic<std::uint64_t> reduced{0};   ///< last chunk whose part this rank reduced
  std::atomic<std::uint64_t> consumed{0};  ///< last chunk whose result this rank copied out
};

/// A tiny lane's header: what the operation is, and (`stamp`, stored last)
/// that it is posted. Written by its rank alone, only for tiny operations.
/// The lane's data starts in the header's line (`head`) and goes on in the
/// lines after it: a reader that saw the stamp of a post of up to 16 bytes
/// has its data in the same cache line (one transfer between cores, not two).
struct alignas(64) tiny_header {
  std::atomic<std::uint64_t> stamp{0};  ///< the inline operation number posted
  std::uint64_t seq = 0;
  std::uint64_t nbytes = 0;
  std::uint32_t dtype = 0;
  std::uint32_t reduce = 0;
  std::uint32_t code = 0;
  std::int32_t root = 0;
  std::uint64_t counts_hash = 0;
  std::byte head[16];  ///< the first bytes of the lane's data
};

/// The largest source a collective posts on a tiny lane.
inline constexpr std::size_t tiny_bytes = 1024;
/// Room after an alltoall's source on its lane for its send and receive
/// counts (up to 32 ranks).
inline constexpr std::size_t tiny_splits_bytes = 512;
/// Where an alltoall's counts start on its lane: after its source of
/// `source_bytes`, on the next 8 bytes.
constexpr std::size_t tiny_splits_at(std::uint64_t source_bytes) {
  return (static_cast<std::size_t>(source_bytes) + 7) & ~std::size_t{7};
}
/// Data a tiny lane holds after its header.
inline constexpr std::size_t tiny_lane_bytes = tiny_bytes + tiny_splits_bytes;
/// A tiny lane: its header line and its data.
inline constexpr std::size_t tiny_stride = sizeof(tiny_header) + tiny_lane_bytes;

struct alignas(64) rank_identity {
  std::atomic<std::int32_t> pid{0};
  std::atomic<std::uint32_t> left{0};  ///< 1 once the rank destroyed the group
};

class segment {
 public:
  /// Creates a new segment for `shape`: a sealed memfd (memory/sealed_memfd)
  /// that other ranks find by name() ("NAME@PID:FD").
  static std::unique_ptr<segment> create(const segment_shape& shape);
  /// Maps the segment another rank created, found by its name(); ranks of
  /// one process share one mapping.
  static std::unique_ptr<segment> open(const std::string& name, const segment_shape& shape);
  ~segment();
  segment(const segment&) = delete;
  segment& operator=(const segment&) = delete;

  const std::string& name() const noexcept { return name_; }
  const segment_shape& shape() const noexcept { return shape_; }
  /// The creator closes the memfd's descriptor (the mappings stay) once
  /// every rank opened it: nothing can open the segment after that.
  void close_descriptor();

  rank_progress& progress(int r) noexcept;
  rank_identity& identity(int r) noexcept;
  /// How many ranks left the group so far (each set its identity's `left`
  /// first): a waiting rank reads every identity only once this moved.
  std::atomic<std::uint32_t>& departures() noexcept;
  op_descriptor& descriptor(int r, std::uint64_t op) noexcept;               ///< slot op % 2
  std::atomic<std::uint64_t>& announced(int r, std::uint64_t seq) noexcept;  ///< slot seq % 64
  std::byte* small_slot(int r, std::uint64_t op) noexcept;                   ///< slot op % 2
  std::int64_t* counts(int r, std::uint64_t op) noexcept;  ///< 2 * size; slot op % 2
  tiny_header& tiny(int r, std::uint64_t op) noexcept;     ///< lane op % 2
  std::byte* tiny_data(int r, std::uint64_t op) noexcept;  ///< lane op % 2
  std::byte* stage(int r, std::uint64_t chunk) noexcept;   ///< slot chunk % slots
  std::byte* result(std::uint64_t chunk) noexcept;         ///< slot chunk % slots

  /// Wakes the ranks sleeping on rank `r`'s bell (r published a counter);
  /// free when nobody sleeps.
  void ring(int r) noexcept;
  /// Wakes every sleeper of every bell (abort, leaving).
  void wake_all() noexcept;
  /// Sleeps on rank `r`'s bell: registers as sleeper, then runs `recheck()`,
  /// which may cancel the sleep (returns true when it made progress);
  /// otherwise sleeps until r rings or `max` passes.
  template <class F>
  void sleep(int r, std::chrono::nanoseconds max, const F& recheck) {
    auto& b = bell_of(r);
    b.sleepers.fetch_add(1);
    const auto seen = b.bell.load();
    if (!recheck()) wait_bell(b, seen, max);
    b.sleepers.fetch_sub(1);
  }

 private:
  struct alignas(64) rank_bell {
    std::atomic<std::uint32_t> bell{0};
    std::atomic<std::uint32_t> sleepers{0};
  };
  segment(std::string name, void* base, std::size_t bytes, const segment_shape& shape);
  rank_bell& bell_of(int r) noexcept;
  static void wait_bell(rank_bell& b, std::uint32_t seen, std::chrono::nanoseconds max) noexcept;

  std::string name_;
  std::byte* base_;
  std::size_t bytes_;
  std::shared_ptr<std::byte> mapping_;  ///< unmaps when the process's last user goes
  segment_shape shape_;
  int fd_ = -1;  ///< the creator's memfd, until every rank opened it
  struct offsets {
    std::size_t bells, progress, identity, descriptors, announce, tiny, counts, small, stage,
        result, departures;
  };
  /// Places the regions for `shape`; returns the segment's size.
  static std::size_t plan(const segment_shape& shape, offsets& off);
  offsets off_{};
};

// The accessors every step of a small collective asks, inline (called out of
// line they cost a call each, several per rank per step).
inline rank_progress& segment::progress(int r) noexcept {
  return reinterpret_cast<rank_progress*>(base_ + off_.progress)[r];
}
inline op_descriptor& segment::descriptor(int r, std::uint64_t op) noexcept {
  return reinterpret_cast<op_descriptor*>(base_ + off_.descriptors)[r * 2 + op % 2];
}
inline tiny_header& segment::tiny(int r, std::uint64_t op) noexcept {
  return *reinterpret_cast<tiny_header*>(base_ + off_.tiny +
                                         (static_cast<std::size_t>(r) * 2 + op % 2) * tiny_stride);
}
inline std::byte* segment::tiny_data(int r, std::uint64_t op) noexcept {
  return tiny(r, op).head;  // and on past the header's line: tiny_lane_bytes in all
}

}  // namespace troupe::detail
