#include "memory/recycled.hpp"

#include <atomic>
#include <mutex>
#include <thread>

namespace troupe::detail {
namespace {

constexpr std::size_t step = 64;     // size classes of 64 bytes
constexpr std::size_t classes = 32;  // up to 2 KiB
constexpr unsigned depth = 8;        // blocks kept per class and thread
// What the depot (below) keeps of one class at most: 128 KiB.
constexpr std::size_t depot_bytes = 128 * 1024;

// Trivially destructible, so reaching it is one thread-local lookup with no
// guard, and it stays readable until the thread ends; `sweeper` (below)
// empties it at thread exit.
struct shelf {
  void* blocks[classes][depth];
  unsigned char count[classes];
  bool swept_at_exit;  // the thread's sweeper is registered
  bool gone;           // the thread is ending: frees go to operator delete
  bool open;           // swept_at_exit and not gone: frees may shelve at once
};
thread_local shelf here{};

// Where blocks go between threads. A block is often made on one thread and
// freed on another: a message that came before its receive is read into a
// buffer by the thread that reads the ring (the reader, or whichever rank
// thread polled) and freed by the one that received it; a work state may
// lose its last owner on the thread that completed it. The freeing
// thread's shelf fills and the making thread's empties, so each block would
// go through malloc and free. A full shelf hands its whole class over as one
// batch instead, and an empty one takes a batch back: one lock per `depth`
// blocks. A batch is its first block, holding the others' addresses and the
// next batch (a block is at least 64 bytes: 8 words). Never destroyed: the
// blocks stay reachable until the process ends.
static_assert(depth * sizeof(void*) <= step);
// Held for a pointer swap: a taker that finds it held yields until it is free.
struct depot_lock {
  std::atomic_flag held = ATOMIC_FLAG_INIT;
  void lock() noexcept {
    while (held.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
  }
  void unlock() noexcept { held.clear(std::memory_order_release); }
};
struct depot_class {
  depot_lock lock;
  std::atomic<void**> top{nullptr};  // read unlocked only to skip an empty depot
  std::size_t batches = 0;
};
depot_class depot[classes];

std::size_t depot_capacity(std::size_t c) {
  return depot_bytes / ((c + 1) * step * depth);
}

// Hands the shelf's full class over; false where the depot has no room.
bool hand_over(shelf& s, std::size_t c) {
  auto** batch = static_cast<void**>(s.blocks[c][0]);
  for (unsigned i = 1; i < depth; ++i) batch[i - 1] = s.blocks[c][i];
  auto& d = depot[c];
  std::lock_guard<depot_lock> g{d.lock};
  if (d.batches >= depot_capacity(c)) return false;
  batch[depth - 1] = d.top.load(std::memory_order_relaxed);
  d.top.store(batch, std::memory_order_relaxed);
  ++d.batches;
  s.count[c] = 0;
  return true;
}

// Fills the shelf's empty class from the depot; false where it has none.
bool take_back(shelf& s, std::size_t c) {
  auto& d = depot[c];
  if (!d.top.load(std::memory_order_relaxed)) return false;
  void** batch = nullptr;
  {
    std::lock_guard<depot_lock> g{d.lock};
    batch = d.top.load(std::memory_order_relaxed);
    if (!batch) return false;
    d.top.store(static_cast<void**>(batch[depth - 1]), std::memory_order_relaxed);
    --d.batches;
  }
  for (unsigned i = 1; i < depth; ++i) s.blocks[c][i] = batch[i - 1];
  s.blocks[c][0] = batch;
  s.count[c] = depth;
  return true;
}

struct sweeper {
  ~sweeper() {
    auto& s = here;
    s.gone = true;
    s.open = false;
    for (std::size_t c = 0; c < classes; ++c) {
      for (unsigned i = 0; i < s.count[c]; ++i) ::operator delete(s.blocks[c][i]);
      s.count[c] = 0;  // what is allocated later at thread exit comes from operator new
    }
  }
};

// Built (and its destructor registered) on the thread's first shelving.
[[gnu::noinline]] void register_sweeper(shelf& s) {
  thread_local sweeper sweep;
  (void)sweep;
  s.swept_at_exit = true;
  s.open = !s.gone;
}

std::size_t class_of(std::size_t bytes) {
  return bytes == 0 ? 0 : (bytes - 1) / step;
}

// The slow paths, apart so that the common ones stay a few instructions.
[[gnu::noinline]] void* refill(shelf& s, std::size_t c) {
  if (!s.gone && take_back(s, c)) {
    if (!s.swept_at_exit) register_sweeper(s);
    return s.blocks[c][--s.count[c]];
  }
  // The whole class's size: any block of the class serves any request in it.
  return ::operator new((c + 1) * step);
}

[[gnu::noinline]] void shelve(shelf& s, std::size_t c, void* p) noexcept {
  if (s.gone || (s.count[c] == depth && !hand_over(s, c))) {
    ::operator delete(p);
    return;
  }
  if (!s.swept_at_exit) register_sweeper(s);
  s.blocks[c][s.count[c]++] = p;
}

}  // namespace

void* recycled_allocate(std::size_t bytes) {
  const auto c = class_of(bytes);
  if (c >= classes) return ::operator new(bytes);
  auto& s = here;
  if (s.count[c] != 0) return s.blocks[c][--s.count[c]];
  return refill(s, c);
}

void recycled_free(void* p, std::size_t bytes) noexcept {
  const auto c = class_of(bytes);
  if (!p || c >= classes) {
    ::operator delete(p);
    return;
  }
  auto& s = here;
  if (s.open && s.count[c] < depth) {
    s.blocks[c][s.count[c]++] = p;
    return;
  }
  shelve(s, c, p);
}

}  // namespace troupe::detail
