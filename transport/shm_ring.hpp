#pragma once
// shm_ring — a byte_stream through a ring buffer in shared memory,
// for processes on one host (one ring per direction and pair of ranks).
//
// Single producer, single consumer. Positions are monotonically growing byte
// counts (head: written, tail: read). A waiting side polls briefly, then
// sleeps on a futex in the shared segment (pure spinning collapses when
// ranks outnumber cores, pure blocking costs 10–20 µs per wake-up), so
// waits never burn a core for long.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/frame.hpp"

namespace troupe::detail {

class shm_ring final : public byte_stream {
 public:
  bool writes_by_copy() const noexcept override { return true; }
  /// Creates a new ring of `capacity` bytes: a sealed memfd
  /// (memory/sealed_memfd) named `name`; the writer side. Its reader finds
  /// it by name() ("NAME@PID:FD").
  static std::unique_ptr<shm_ring> create(const std::string& name, std::size_t capacity);
  /// Opens the ring that process `pid` created, found by its name(), which
  /// must start with `prefix`; the reader side. Throws errc::backend when
  /// it is not such a ring.
  static std::unique_ptr<shm_ring> open(const std::string& name, int pid,
                                        const std::string& prefix);
  /// The writer closes the memfd's descriptor once the reader opened the
  /// ring (the mappings stay): nothing can open it after that.
  void opened_by_reader();
  ~shm_ring() override;

  bool write(const void* data, std::size_t n) override;
  /// write(), giving up at `deadline` while the ring has no room (false, as
  /// when it is closed; the bytes that fitted are in the ring, `*written`
  /// of them where given).
  bool write_until(const void* data, std::size_t n, std::chrono::steady_clock::time_point deadline,
                   std::size_t* written = nullptr);
  /// Bytes write() could take now without waiting (the writer's side).
  std::size_t writable() const;
  bool read(void* data, std::size_t n) override;
  /// Copies up to `n` bytes that are there now, without waiting: the count,
  /// 0 when the ring is empty, -1 when it is empty and closed. The room it
  /// frees is told to the writer by publish_read() (or here once a 16th of
  /// the ring waits to be told): a reader that tells at once waits for the
  /// writer's copy of that cache line before it can go on.
  long read_some(void* data, std::size_t n);
  /// Tells the writer the room read_some() freed (after a batch of frames).
  void publish_read();
  /// Whether bytes are there to read now (the reader's side).
  bool readable() const;
  /// Waits until bytes are there (true) or the ring is closed and empty or
  /// `max` passed (false when closed). While bytes keep coming it looks for
  /// them between yields (until `linger` passed since the ring last moved)
  /// before it sleeps, so that their writers need not wake it.
  bool wait_readable(std::chrono::milliseconds max,
                     std::chrono::microseconds linger = std::chrono::microseconds{0});
  /// The linger of a reader thread whose ranks have CPUs enough (data_plane).
  static constexpr std::chrono::microseconds linger{50};
  /// System calls write() made to wake a sleeping reader (the writer's side).
  std::uint64_t wakes_sent() const noexcept { return wakes_sent_; }
  void close() override;
  /// A thread of the reading process starts (+1) or stops (-1) polling the
  /// ring itself (read_some): meanwhile writes do not wake the sleeping
  /// reader thread (a system call per message, and a thread that competes
  /// with the poller for the bytes). True when the last poller stopped while
  /// bytes wait that no writer woke the reader for: the caller reads them,
  /// or wakes the reader (wake_reader).
  bool polling(int delta);
  /// Wakes the reader thread if it sleeps.
  void wake_reader();
  const std::string& name() const noexcept { return name_; }

 private:
  struct control;
  shm_ring(std::string name, void* base, std::size_t mapped, bool owner);
  bool wait_for(std::atomic<std::uint32_t>& seq, std::atomic<std::uint32_t>& waiting,
                const std::atomic<std::uint64_t>& pos, std::uint64_t not_equal_to,
                std::chrono::steady_clock::time_point deadline =
                    std::chrono::steady_clock::time_point::max());
  /// Maps every page of the data once this side is in use, `through` bytes
  /// having passed it (see shm_ring.cpp).
  void populate_in_use(std::uint64_t through) {
    if (!populated_ && through > capacity_ / 16) populate();
  }
  void populate();

  std::string name_;
  void* base_;
  std::size_t mapped_;
  bool owner_;
  int fd_ = -1;  ///< the writer's memfd, until the reader opened it
  control* ctl_;
  char* data_;
  // The data's bytes, from this side's mapping: never the control block's
  // `capacity`, which the other process writes (a reader that trusted it
  // could be made to copy past its mapping).
  std::uint64_t capacity_;
  bool populated_ = false;  // under the side's lock (one writer, one reader at a time)
  // The reader's side: bytes read so far (ahead of the control block's
  // `tail` until published; atomic for readable(), which takes no lock)
  // and what the writer was last told.
  std::atomic<std::uint64_t> read_{0};
  std::uint64_t published_ = 0;
  void publish(std::uint64_t pos);
  std::uint64_t wakes_sent_ = 0;  // the writer's side (one writer at a time)
};

}  // namespace troupe::detail
