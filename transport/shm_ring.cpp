#include "transport/shm_ring.hpp"

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/futex.hpp"
#include "memory/sealed_memfd.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

struct shm_ring::control {
  alignas(64) std::atomic<std::uint64_t> head;  // bytes written so far
  alignas(64) std::atomic<std::uint64_t> tail;  // bytes read so far
  alignas(64) std::atomic<std::uint32_t> head_seq;
  std::atomic<std::uint32_t> reader_waiting;
  std::atomic<std::uint32_t> polled;  // threads of the reader's process polling (see polling())
  alignas(64) std::atomic<std::uint32_t> tail_seq;
  std::atomic<std::uint32_t> writer_waiting;
  alignas(64) std::atomic<std::uint32_t> closed;
  std::uint64_t capacity;
};

namespace {

constexpr std::size_t data_offset = 4096;

#ifndef MADV_POPULATE_READ
constexpr int MADV_POPULATE_READ = 22;  // Linux 5.14
#endif
#ifndef MADV_POPULATE_WRITE
constexpr int MADV_POPULATE_WRITE = 23;
#endif

}  // namespace

std::unique_ptr<shm_ring> shm_ring::create(const std::string& name, std::size_t capacity) {
  // A sealed memfd: the reader's process can never truncate it under the
  // writer's mapping (nor the other way round).
  const std::size_t size = data_offset + capacity;
  const auto m = map_sealed_memfd(name, size);
  if (m.fd < 0)
    throw error(errc::backend, "shared memory: cannot create or map the ring '" + name + "' (" +
                                   std::to_string(size) + " bytes): " + std::strerror(errno));
  auto* ctl = new (m.addr) control{};
  ctl->capacity = capacity;
  auto ring =
      std::unique_ptr<shm_ring>(new shm_ring(memfd_locator(name, m.fd), m.addr, size, true));
  ring->fd_ = m.fd;
  return ring;
}

std::unique_ptr<shm_ring> shm_ring::open(const std::string& locator, int pid,
                                         const std::string& prefix) {
  std::string name, why;
  int owner = 0, fd = -1;
  if (!parse_memfd_locator(locator, &name, &owner, &fd) || name.rfind(prefix, 0) != 0)
    throw error(errc::backend, "shared memory: '" + locator + "' does not name a ring");
  if (owner != pid)
    throw error(errc::backend, "shared memory: the ring '" + locator + "' is not of process " +
                                   std::to_string(pid));
  std::size_t size = 0;
  const int mine = open_sealed_memfd(pid, fd, data_offset + 1, name, &size, &why);
  if (mine < 0) throw error(errc::backend, "shared memory: cannot open a ring: " + why);
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, mine, 0);
  ::close(mine);
  if (base == MAP_FAILED) throw error(errc::backend, "shared memory: cannot map '" + locator + "'");
  return std::unique_ptr<shm_ring>(new shm_ring(locator, base, size, false));
}

void shm_ring::opened_by_reader() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

shm_ring::shm_ring(std::string name, void* base, std::size_t mapped, bool owner)
    : name_(std::move(name)),
      base_(base),
      mapped_(mapped),
      owner_(owner),
      ctl_(static_cast<control*>(base)),
      data_(static_cast<char*>(base) + data_offset),
      capacity_(mapped - data_offset) {}

shm_ring::~shm_ring() {
  close();
  opened_by_reader();  // or never will
  ::munmap(base_, mapped_);
}

void shm_ring::close() {
  ctl_->closed.store(1);
  ctl_->head_seq.fetch_add(1);
  ctl_->tail_seq.fetch_add(1);
  futex_wake(ctl_->head_seq);
  futex_wake(ctl_->tail_seq);
}

/// Waits until `pos` differs from `not_equal_to`, the ring closes or
/// `deadline` passes (false for the last two).
bool shm_ring::wait_for(std::atomic<std::uint32_t>& seq, std::atomic<std::uint32_t>& waiting,
                        const std::atomic<std::uint64_t>& pos, std::uint64_t not_equal_to,
                        std::chrono::steady_clock::time_point deadline) {
  for (int i = 0; i < 4000; ++i) {  // poll a few microseconds first
    if (pos.load(std::memory_order_acquire) != not_equal_to) return true;
    // Closed: data published just before the close still counts.
    if (ctl_->closed.load()) return pos.load() != not_equal_to;
    cpu_relax();
  }
  for (;;) {
    const auto s = seq.load();
    waiting.store(1);
    if (pos.load() != not_equal_to) break;
    if (ctl_->closed.load()) {
      waiting.store(0);
      return pos.load() != not_equal_to;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      waiting.store(0);
      return false;
    }
    // Re-checks `closed` every 20 ms.
    futex_wait(seq, s,
               std::min<std::chrono::nanoseconds>(deadline - now, std::chrono::milliseconds(20)));
  }
  waiting.store(0);
  return true;
}

namespace {

/// The most bytes of a copy of `n` the other side waits for before it hears
/// of them: a large message streams through the ring, the reader copying
/// one piece out while the writer copies the next in: pieces of 256 KiB to
/// 1 MiB keep both sides copying, where pieces as large as the free space
/// leave one side waiting; a 1 MiB message goes fastest in quarters.
std::uint64_t publish_step(std::size_t n) {
  return std::clamp<std::uint64_t>(n / 4, std::uint64_t{256} << 10, std::uint64_t{1} << 20);
}

}  // namespace

// A ring's pages are mapped (the writer's allocated) at once when its side
// is in real use: faulted one at a time they would cost each side a fault
// per 4 KiB until the ring had gone round once, slowing its first hundreds
// of exchanges. "In use" is past its first sixteenth: every pair of a host
// has a ring and most never carry more than a goodbye or a few heartbeats,
// which would otherwise allocate and zero the whole ring (4 MiB, about 2 ms
// per ring when a world ends). A kernel without the advice (older than
// 5.14) faults them one at a time.
void shm_ring::populate() {
  populated_ = true;
  ::madvise(data_, static_cast<std::size_t>(capacity_),
            owner_ ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
}

bool shm_ring::write(const void* data, std::size_t n) {
  return write_until(data, n, std::chrono::steady_clock::time_point::max());
}

bool shm_ring::write_until(const void* data, std::size_t n,
                           std::chrono::steady_clock::time_point deadline, std::size_t* written) {
  populate_in_use(ctl_->head.load(std::memory_order_relaxed) + n);
  auto* p = static_cast<const char*>(data);
  const auto cap = capacity_;
  auto gave_up = [&] {
    if (written) *written = static_cast<std::size_t>(p - static_cast<const char*>(data));
    return false;
  };
  while (n > 0) {
    const auto head = ctl_->head.load(std::memory_order_relaxed);
    auto tail = ctl_->tail.load(std::memory_order_acquire);
    if (head - tail == cap) {
      if (!wait_for(ctl_->tail_seq, ctl_->writer_waiting, ctl_->tail, tail, deadline))
        return gave_up();
      continue;
    }
    if (ctl_->closed.load(std::memory_order_relaxed)) return gave_up();
    const auto offset = head % cap;
    const auto chunk =
        std::min<std::uint64_t>({n, cap - (head - tail), cap - offset, publish_step(n)});
    std::memcpy(data_ + offset, p, chunk);
    ctl_->head.store(head + chunk);
    ctl_->head_seq.fetch_add(1);
    if (ctl_->reader_waiting.load() && !ctl_->polled.load()) {
      futex_wake(ctl_->head_seq);
      ++wakes_sent_;
    }
    p += chunk;
    n -= chunk;
  }
  if (written) *written = static_cast<std::size_t>(p - static_cast<const char*>(data));
  return true;
}

std::size_t shm_ring::writable() const {
  const auto head = ctl_->head.load(std::memory_order_relaxed);
  const auto tail = ctl_->tail.load(std::memory_order_acquire);
  return static_cast<std::size_t>(capacity_ - (head - tail));
}

long shm_ring::read_some(void* data, std::size_t n) {
  populate_in_use(read_.load(std::memory_order_relaxed) + n);
  const auto cap = capacity_;
  const auto tail = read_.load(std::memory_order_relaxed);
  const auto head = ctl_->head.load(std::memory_order_acquire);
  if (head == tail) return ctl_->closed.load() && ctl_->head.load() == tail ? -1 : 0;
  const auto offset = tail % cap;
  const auto chunk = std::min<std::uint64_t>({n, head - tail, cap - offset, publish_step(n)});
  std::memcpy(data, data_ + offset, chunk);
  read_.store(tail + chunk, std::memory_order_relaxed);
  if (tail + chunk - published_ >= cap / 16) publish(tail + chunk);
  return static_cast<long>(chunk);
}

void shm_ring::publish_read() {
  const auto pos = read_.load(std::memory_order_relaxed);
  if (pos == published_) return;
  if (pos - published_ >= capacity_ / 16) {
    publish(pos);
    return;
  }
  // Little freed: a plain store, no fence. A writer that found the ring
  // full and sleeps while this misses its flag still has most of the ring
  // unread before it: reading that publishes again and sees the flag.
  ctl_->tail.store(pos, std::memory_order_release);
  published_ = pos;
  if (ctl_->writer_waiting.load(std::memory_order_relaxed)) {
    ctl_->tail_seq.fetch_add(1);
    futex_wake(ctl_->tail_seq);
  }
}

void shm_ring::publish(std::uint64_t pos) {
  ctl_->tail.store(pos);
  published_ = pos;
  ctl_->tail_seq.fetch_add(1);
  if (ctl_->writer_waiting.load()) futex_wake(ctl_->tail_seq);
}

bool shm_ring::readable() const {
  return ctl_->head.load(std::memory_order_acquire) != read_.load(std::memory_order_relaxed);
}

bool shm_ring::wait_readable(std::chrono::milliseconds max, std::chrono::microseconds linger) {
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + max;
  // While bytes keep coming (read by this thread or by a thread that polls),
  // look between yields instead of sleeping: a writer then finds nobody
  // asleep and makes no system call to wake this reader, and the reader
  // takes no CPU from the threads that poll on being woken. (2 processes,
  // halo exchange of 4 B by batch_isend_irecv: 0.8 wake-ups per exchange
  // and process before; the yields run at the reader thread's low priority
  // and stop `linger` after the last byte came.)
  auto seen = ctl_->head.load(std::memory_order_acquire);
  for (auto moved = start;;) {
    if (seen != read_.load(std::memory_order_relaxed)) return true;
    if (ctl_->closed.load()) break;
    const auto now = std::chrono::steady_clock::now();
    if (now - moved >= linger || now >= until) break;
    ::sched_yield();
    if (const auto h = ctl_->head.load(std::memory_order_acquire); h != seen) {
      seen = h;
      moved = now;
    }
  }
  for (;;) {
    const auto s = ctl_->head_seq.load();
    ctl_->reader_waiting.store(1);
    const bool data = ctl_->head.load() != read_.load(std::memory_order_relaxed);
    if (data || ctl_->closed.load()) {
      ctl_->reader_waiting.store(0);
      return data || !ctl_->closed.load();
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) {
      ctl_->reader_waiting.store(0);
      return true;
    }
    futex_wait(ctl_->head_seq, s, std::min<std::chrono::nanoseconds>(until - now, max));
  }
}

bool shm_ring::read(void* data, std::size_t n) {
  populate_in_use(read_.load(std::memory_order_relaxed) + n);
  auto* p = static_cast<char*>(data);
  const auto cap = capacity_;
  while (n > 0) {
    const auto tail = read_.load(std::memory_order_relaxed);
    auto head = ctl_->head.load(std::memory_order_acquire);
    if (head == tail) {
      if (!wait_for(ctl_->head_seq, ctl_->reader_waiting, ctl_->head, head)) return false;
      continue;
    }
    const auto offset = tail % cap;
    const auto chunk = std::min<std::uint64_t>({n, head - tail, cap - offset});
    std::memcpy(p, data_ + offset, chunk);
    read_.store(tail + chunk, std::memory_order_relaxed);
    publish(tail + chunk);
    p += chunk;
    n -= chunk;
  }
  return true;
}

bool shm_ring::polling(int delta) {
  if (ctl_->polled.fetch_add(static_cast<std::uint32_t>(delta)) +
          static_cast<std::uint32_t>(delta) !=
      0)
    return false;
  // The last poller left: bytes written meanwhile woke nobody (a write
  // after the count above sees it and wakes the reader itself).
  return ctl_->head.load() != read_.load();
}

void shm_ring::wake_reader() {
  if (!ctl_->reader_waiting.load()) return;
  ctl_->head_seq.fetch_add(1);
  futex_wake(ctl_->head_seq);
}

}  // namespace troupe::detail
