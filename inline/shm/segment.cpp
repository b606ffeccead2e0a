#include "inline/shm/segment.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>

#include "base/futex.hpp"
#include "memory/sealed_memfd.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

namespace {

constexpr std::size_t line = 64;
constexpr std::size_t page = 4096;
constexpr std::uint64_t announce_slots = 64;
static_assert(sizeof(tiny_header) == line && tiny_lane_bytes % line == 0);
// The data (tiny_lane_bytes from `head`) ends within the lane.
static_assert(offsetof(tiny_header, head) + tiny_lane_bytes <= tiny_stride);

std::size_t round_up(std::size_t n, std::size_t to) {
  return (n + to - 1) / to * to;
}

/// Bytes of one slot of alltoall counts in a group of n: 2n counts, on lines of their own.
std::size_t counts_stride(std::size_t n) {
  return round_up(2 * n * sizeof(std::int64_t), line);
}

/// Every segment's name starts so; open() maps nothing else.
constexpr const char* segment_prefix = "troupe-segment-";

std::string fresh_name() {
  std::random_device rd;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%d-%08x%08x", segment_prefix, static_cast<int>(::getpid()),
                rd(), rd());
  return buf;
}

}  // namespace

segment_shape shape_for(int size) {
  segment_shape shape;
  shape.size = size;
  shape.small_bytes = size == 2 ? std::size_t{1} << 20 : std::size_t{32} << 10;
  return shape;
}

segment::segment(std::string name, void* base, std::size_t bytes, const segment_shape& shape)
    : name_(std::move(name)), base_(static_cast<std::byte*>(base)), bytes_(bytes), shape_(shape) {
  plan(shape_, off_);
}

std::size_t segment::plan(const segment_shape& shape, offsets& off) {
  const auto n = static_cast<std::size_t>(shape.size);
  const auto slots = static_cast<std::size_t>(shape.chunk_slots);
  std::size_t at = 0;
  off.bells = at;
  at += n * sizeof(rank_bell);
  off.progress = at;
  at += n * sizeof(rank_progress);
  off.identity = at;
  at += n * sizeof(rank_identity);
  off.descriptors = at;
  at += round_up(n * 2 * sizeof(op_descriptor), line);
  off.announce = at;
  at += n * announce_slots * sizeof(std::uint64_t);
  off.tiny = round_up(at, line);
  at = off.tiny + n * 2 * tiny_stride;
  off.counts = at;
  at += n * 2 * counts_stride(n);
  // The data slots start half a page in: buffers are often page aligned
  // (troupe's own from 64 KiB on), and a slot at the same offset in its page
  // makes a loop that reads one and writes the other stall on 4 KiB
  // aliasing.
  off.small = round_up(at, page) + page / 2;
  off.stage = off.small + round_up(n * 2 * shape.small_bytes, page);
  off.result = off.stage + n * slots * shape.chunk_bytes;
  // Last: a line of its own that the hot regions above do not move for.
  off.departures = off.result + slots * shape.chunk_bytes;
  return off.departures + line;
}

namespace {

void* map_fd(int fd, std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// Ranks of one process share one mapping of a segment. A mapping per rank
// counted every page once per rank in the process's page tables and resident
// size: with n ranks in one process, n segments of n ranks each (a
// simulation of 256 ranks: 2.8 MiB per rank, growing with n).
struct mappings {
  std::mutex mtx;
  std::map<std::string, std::weak_ptr<std::byte>> by_name;
};

mappings& process_mappings() {
  static auto* m = new mappings;  // never destroyed: segments may outlive main's statics
  return *m;
}

std::shared_ptr<std::byte> share_mapping(const std::string& name, void* base, std::size_t bytes) {
  std::shared_ptr<std::byte> m(static_cast<std::byte*>(base),
                               [bytes](std::byte* p) { ::munmap(p, bytes); });
  auto& all = process_mappings();
  std::lock_guard<std::mutex> g{all.mtx};
  std::erase_if(all.by_name, [](const auto& kv) { return kv.second.expired(); });
  all.by_name[name] = m;
  return m;
}

std::shared_ptr<std::byte> mapped_here(const std::string& name) {
  auto& all = process_mappings();
  std::lock_guard<std::mutex> g{all.mtx};
  auto it = all.by_name.find(name);
  return it == all.by_name.end() ? nullptr : it->second.lock();
}

}  // namespace

std::unique_ptr<segment> segment::create(const segment_shape& shape) {
  const auto name = fresh_name();
  offsets off;
  const auto bytes = plan(shape, off);
  // A sealed memfd: no process can truncate it under a peer's mapping.
  const auto m = map_sealed_memfd(name, bytes);
  if (m.fd < 0)
    throw error(errc::backend, "shared memory: cannot create or map the segment '" + name + "' (" +
                                   std::to_string(bytes) + " bytes): " + std::strerror(errno));
  // A fresh file reads as zeros: every counter starts at 0.
  auto seg = std::unique_ptr<segment>(new segment(memfd_locator(name, m.fd), m.addr, bytes, shape));
  seg->fd_ = m.fd;
  seg->mapping_ = share_mapping(seg->name_, m.addr, bytes);
  return seg;
}

std::unique_ptr<segment> segment::open(const std::string& locator, const segment_shape& shape) {
  offsets planned;
  const auto want = plan(shape, planned);
  if (auto m = mapped_here(locator)) {
    auto seg = std::unique_ptr<segment>(new segment(locator, m.get(), want, shape));
    seg->mapping_ = std::move(m);
    return seg;
  }
  std::string name, why;
  int pid = 0, peer_fd = -1;
  if (!parse_memfd_locator(locator, &name, &pid, &peer_fd) || name.rfind(segment_prefix, 0) != 0)
    throw error(errc::backend, "shared memory: '" + locator + "' does not name a segment");
  std::size_t size = 0;
  const int fd = open_sealed_memfd(pid, peer_fd, want, name, &size, &why);
  if (fd < 0) throw error(errc::backend, "shared memory: cannot open the segment: " + why);
  void* base = size == want ? map_fd(fd, want) : nullptr;
  ::close(fd);
  if (!base)
    throw error(errc::backend, "shared memory: cannot map '" + locator + "' (" +
                                   std::to_string(size) + " bytes, expected " +
                                   std::to_string(want) + ")");
  auto seg = std::unique_ptr<segment>(new segment(locator, base, want, shape));
  seg->mapping_ = share_mapping(locator, base, want);
  return seg;
}

segment::~segment() {
  close_descriptor();
}

void segment::close_descriptor() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

rank_identity& segment::identity(int r) noexcept {
  return reinterpret_cast<rank_identity*>(base_ + off_.identity)[r];
}

std::atomic<std::uint32_t>& segment::departures() noexcept {
  return *reinterpret_cast<std::atomic<std::uint32_t>*>(base_ + off_.departures);
}

std::atomic<std::uint64_t>& segment::announced(int r, std::uint64_t seq) noexcept {
  return reinterpret_cast<std::atomic<std::uint64_t>*>(
      base_ + off_.announce)[static_cast<std::uint64_t>(r) * announce_slots + seq % announce_slots];
}

std::int64_t* segment::counts(int r, std::uint64_t op) noexcept {
  const auto n = static_cast<std::size_t>(shape_.size);
  return reinterpret_cast<std::int64_t*>(
      base_ + off_.counts + (static_cast<std::size_t>(r) * 2 + op % 2) * counts_stride(n));
}

std::byte* segment::small_slot(int r, std::uint64_t op) noexcept {
  return base_ + off_.small + (static_cast<std::size_t>(r) * 2 + op % 2) * shape_.small_bytes;
}

std::byte* segment::stage(int r, std::uint64_t chunk) noexcept {
  const auto slots = static_cast<std::size_t>(shape_.chunk_slots);
  return base_ + off_.stage +
         (static_cast<std::size_t>(r) * slots + chunk % slots) * shape_.chunk_bytes;
}

std::byte* segment::result(std::uint64_t chunk) noexcept {
  return base_ + off_.result +
         (chunk % static_cast<std::size_t>(shape_.chunk_slots)) * shape_.chunk_bytes;
}

segment::rank_bell& segment::bell_of(int r) noexcept {
  return reinterpret_cast<rank_bell*>(base_ + off_.bells)[r];
}

void segment::ring(int r) noexcept {
  auto& b = bell_of(r);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the counter store before the load below
  if (b.sleepers.load(std::memory_order_relaxed) == 0) return;
  b.bell.fetch_add(1);
  futex_wake(b.bell);
}

void segment::wake_all() noexcept {
  // As ring(): a bell nobody sleeps on costs a load, not a system call (each
  // of n ranks leaving wakes all n bells).
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the flag's store before the loads below
  for (int r = 0; r < shape_.size; ++r) {
    auto& b = bell_of(r);
    if (b.sleepers.load(std::memory_order_relaxed) == 0) continue;
    b.bell.fetch_add(1);
    futex_wake(b.bell);
  }
}

void segment::wait_bell(rank_bell& b, std::uint32_t seen, std::chrono::nanoseconds max) noexcept {
  futex_wait(b.bell, seen, max);
}

}  // namespace troupe::detail
