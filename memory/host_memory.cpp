#include "memory/host_memory.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "memory/recycled.hpp"
#include "memory/sealed_memfd.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

namespace {

std::string errno_text() {
  return std::strerror(errno);
}

constexpr std::size_t huge_page = std::size_t{2} << 20;

/// The shared memory of this process that peers may map, by address
/// (tensor::empty_shared allocations and mappings shared in place), and the
/// host allocations of 64 KiB and more, each a mapping of its own (pooled
/// below 2 MiB).
struct shared_registry {
  std::mutex mtx;
  std::map<std::uintptr_t, shared_range> live;
  struct large {
    std::size_t requested = 0;  ///< bytes asked for
    std::size_t size = 0;       ///< bytes mapped (whole pages)
    int fd = -1;                ///< its memfd, once shared in place
    int uses = 0;               ///< share_in_place calls so far
  };
  std::map<std::uintptr_t, large> large_allocations;
  std::size_t moved = 0;  ///< allocations shared in place now (each holds a descriptor)
  std::uint64_t next_id = 0;
};

shared_registry& shared_allocations() {
  static auto* r = new shared_registry;  // never destroyed: tensors may outlive statics
  return *r;
}

/// `size` bytes (whole huge pages) of private memory, 2 MiB aligned, with
/// huge pages asked for.
void* map_large(std::size_t size) {
  void* raw =
      ::mmap(nullptr, size + huge_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc{};
  const auto at = reinterpret_cast<std::uintptr_t>(raw);
  const auto aligned = (at + huge_page - 1) / huge_page * huge_page;
  if (aligned > at) ::munmap(raw, aligned - at);
  if (const auto tail = at + huge_page - aligned; tail > 0)
    ::munmap(reinterpret_cast<void*>(aligned + size), tail);
  ::madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

/// Registers a mapping of its own of `size` bytes at `p`, handed out for
/// `bytes`.
void register_mapping(void* p, std::size_t bytes, std::size_t size) {
  auto& reg = shared_allocations();
  std::lock_guard<std::mutex> g{reg.mtx};
  reg.large_allocations[reinterpret_cast<std::uintptr_t>(p)] = {bytes, size, -1, 0};
}

/// Forgets the mapping of its own at `at` (the caller holds reg.mtx);
/// returns its memfd, if it was shared in place, else -1.
int forget_mapping(shared_registry& reg, std::uintptr_t at) {
  int fd = -1;
  if (auto it = reg.large_allocations.find(at); it != reg.large_allocations.end()) {
    fd = it->second.fd;
    reg.moved -= fd >= 0;
    reg.large_allocations.erase(it);
  }
  reg.live.erase(at);
  return fd;
}

/// Unmaps a mapping of its own and forgets it (closing its memfd, if it was
/// shared in place).
void unmap_mapping(void* p, std::size_t size) {
  auto& reg = shared_allocations();
  int fd = -1;
  {
    std::lock_guard<std::mutex> g{reg.mtx};
    fd = forget_mapping(reg, reinterpret_cast<std::uintptr_t>(p));
  }
  ::munmap(p, size);
  if (fd >= 0) ::close(fd);
}

/// Buffers from 64 KiB up to 2 MiB (segments of pipelined collectives,
/// received frames, middle-sized tensors) come from a small cache of freed
/// ones, one list per power of two: each fresh buffer pays its page faults
/// and zeroing (a sixth of a 64 MiB TCP allreduce's time). Up to 64 MiB of
/// them are kept in all, and at least 8 of each size: a 16 MiB TCP
/// broadcast's receiver holds 16 segments at once, and a 4-rank TCP
/// allreduce of 64 MiB holds up to 48 of its 1 MiB segments received ahead
/// of their reduction. Each is a mapping of its own
/// (registered, so that share_in_place can move it into shared memory; a
/// buffer shared so stays shared when it is handed out again).
constexpr std::size_t pooled_min = own_mapping_bytes;
constexpr int pool_classes = 6;  // 64 KiB .. 2 MiB (exclusive)
constexpr std::size_t pool_kept_bytes = std::size_t{64} << 20;
constexpr std::size_t pool_min_depth = 8;

/// Freed private buffers from 2 MiB (whole huge pages) are kept too, a few
/// and by exact size (one shared in place is unmapped, giving its
/// descriptor back): a fresh one pays its page faults and zeroing every time (a
/// halo exchange of 16 MiB rows between 2 processes, whose messages often
/// arrive before their receives and wait in fresh buffers, would spend
/// over a quarter of its time zeroing pages).
constexpr std::size_t large_kept = 4;
constexpr std::size_t large_kept_bytes = std::size_t{128} << 20;

struct buffer_pool {
  std::mutex mtx;
  std::vector<void*> free[pool_classes];
  std::size_t kept = 0;                              // bytes in `free`
  std::vector<std::pair<std::size_t, void*>> large;  // (size, buffer)
  std::size_t large_bytes = 0;
};

void prepare_fork();
void parent_after_fork();
void child_after_fork();

buffer_pool& pool() {
  static buffer_pool* p = new buffer_pool;  // never destroyed: tensors may outlive statics
  static const bool fork_safe =
      ::pthread_atfork(prepare_fork, parent_after_fork, child_after_fork) == 0;
  (void)fork_safe;
  return *p;
}

// Across fork both locks are held (the pool's first, as everywhere), so the
// child finds them free and the lists whole. The child then unmaps the
// pooled buffers that were shared in place: their pages are the parent's
// too, and handing them out would let two processes write one buffer.
void prepare_fork() {
  pool().mtx.lock();
  shared_allocations().mtx.lock();
}

void parent_after_fork() {
  shared_allocations().mtx.unlock();
  pool().mtx.unlock();
}

void child_after_fork() {
  auto& reg = shared_allocations();
  auto& bp = pool();
  auto drop_shared = [&](void* q) {
    const auto at = reinterpret_cast<std::uintptr_t>(q);
    auto it = reg.large_allocations.find(at);
    if (it == reg.large_allocations.end() || it->second.fd < 0) return false;
    ::munmap(q, it->second.size);
    ::close(forget_mapping(reg, at));
    return true;
  };
  for (int cls = 0; cls < pool_classes; ++cls) {
    auto& list = bp.free[cls];
    const auto before = list.size();
    list.erase(std::remove_if(list.begin(), list.end(), drop_shared), list.end());
    bp.kept -= (before - list.size()) * (pooled_min << cls);
  }
  std::erase_if(bp.large, [&](const std::pair<std::size_t, void*>& b) {
    if (!drop_shared(b.second)) return false;
    bp.large_bytes -= b.first;
    return true;
  });
  reg.mtx.unlock();
  bp.mtx.unlock();
}

/// A buffer handed out again: a new owner, whose uses count afresh.
void reissue(void* p, std::size_t bytes) {
  auto& reg = shared_allocations();
  std::lock_guard<std::mutex> g{reg.mtx};
  auto& entry = reg.large_allocations[reinterpret_cast<std::uintptr_t>(p)];
  entry.requested = bytes;
  entry.uses = 0;
}

/// Whether the mapping of its own at `q` was moved into shared memory.
bool shared_in_place(void* q) {
  auto& reg = shared_allocations();
  std::lock_guard<std::mutex> g{reg.mtx};
  auto it = reg.large_allocations.find(reinterpret_cast<std::uintptr_t>(q));
  return it != reg.large_allocations.end() && it->second.fd >= 0;
}

/// `bytes` from 2 MiB: a kept buffer of the same size, or a fresh mapping.
std::shared_ptr<void> large_buffer(std::size_t bytes) {
  const std::size_t size = (bytes + huge_page - 1) / huge_page * huge_page;
  void* p = nullptr;
  {
    auto& bp = pool();
    std::lock_guard<std::mutex> g{bp.mtx};
    for (auto it = bp.large.begin(); it != bp.large.end(); ++it)
      if (it->first == size) {
        p = it->second;
        bp.large_bytes -= size;
        bp.large.erase(it);
        break;
      }
  }
  if (p) {
    reissue(p, bytes);
  } else {
    p = map_large(size);
    register_mapping(p, bytes, size);
  }
  return std::shared_ptr<void>(p, [size](void* q) {
    auto& bp = pool();
    {
      std::lock_guard<std::mutex> g{bp.mtx};  // the pool's lock first, as everywhere
      if (bp.large.size() < large_kept && bp.large_bytes + size <= large_kept_bytes &&
          !shared_in_place(q)) {
        bp.large.emplace_back(size, q);
        bp.large_bytes += size;
        return;
      }
    }
    unmap_mapping(q, size);  // a buffer shared in place gives its descriptor back
  });
}

std::shared_ptr<void> pooled(std::size_t bytes) {
  int cls = 0;
  while ((pooled_min << cls) < bytes) ++cls;
  const std::size_t size = pooled_min << cls;
  void* p = nullptr;
  {
    auto& bp = pool();
    std::lock_guard<std::mutex> g{bp.mtx};
    if (!bp.free[cls].empty()) {
      p = bp.free[cls].back();
      bp.free[cls].pop_back();
      bp.kept -= size;
    }
  }
  if (p) {
    reissue(p, bytes);
  } else {
    p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc{};
    register_mapping(p, bytes, size);
  }
  return std::shared_ptr<void>(p, [cls, size](void* q) {
    auto& bp = pool();
    {
      std::lock_guard<std::mutex> g{bp.mtx};
      if (bp.free[cls].size() < pool_min_depth || bp.kept + size <= pool_kept_bytes) {
        bp.free[cls].push_back(q);
        bp.kept += size;
        return;
      }
    }
    unmap_mapping(q, size);
  });
}

/// Below pooled_min: a block with room to align its start to 64 bytes, from
/// the thread's shelf up to 2 KiB (base/recycled.hpp; operator new above),
/// and the owner count from the shelf too. The aligned operator new takes about
/// 1,000 instructions to allocate and free a 4-byte tensor's buffer
/// (memalign splits a chunk to align it, and free merges it back), and its
/// owner count another trip through operator new: a received message's
/// early payload, a result, a staging buffer would each pay them.
std::shared_ptr<void> small_buffer(std::size_t bytes) {
  constexpr std::size_t align = 64;
  // What the allocator guarantees already (operator new's and malloc's
  // alignment): the slack a block needs to start a 64-byte line inside it.
  constexpr std::size_t slack = align - __STDCPP_DEFAULT_NEW_ALIGNMENT__;
  const std::size_t total = std::max<std::size_t>(bytes, align) + slack;
  void* raw = recycled_allocate(total);
  const auto at = (reinterpret_cast<std::uintptr_t>(raw) + align - 1) & ~(align - 1);
  struct release {
    void* raw;
    std::size_t total;
    void operator()(void*) const noexcept { recycled_free(raw, total); }
  };
  // Should the owner count not be allocated, the constructor releases the block.
  return std::shared_ptr<void>(reinterpret_cast<void*>(at), release{raw, total},
                               recycling_allocator<char>{});
}

}  // namespace

std::shared_ptr<void> allocate_host(std::size_t bytes) {
  // Large buffers are 2 MiB aligned and asked to use huge pages: a fresh
  // 64 MiB buffer then costs 32 page faults instead of 16384 (received
  // frames and collective results are fresh buffers). Each is a mapping of
  // its own, so that share_in_place can replace its pages.
  if (bytes >= huge_page) return large_buffer(bytes);
  if (bytes >= pooled_min) return pooled(bytes);
  return small_buffer(bytes);
}

std::shared_ptr<void> allocate_shared(std::size_t bytes) {
  const std::size_t size = std::max<std::size_t>(bytes, 64);
  const int fd = sealed_memfd(shared_tensor_memfd, size);
  if (fd < 0)
    throw error(errc::backend, "tensor.empty_shared: cannot make " + std::to_string(size) +
                                   " bytes of shared memory: " + errno_text());
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const auto why = errno_text();
    ::close(fd);
    throw error(errc::backend, "tensor.empty_shared: cannot map " + std::to_string(size) +
                                   " bytes of shared memory: " + why);
  }
  ::madvise(p, size, MADV_HUGEPAGE);  // honoured where shared huge pages are enabled
  auto& reg = shared_allocations();
  {
    std::lock_guard<std::mutex> g{reg.mtx};
    reg.live[reinterpret_cast<std::uintptr_t>(p)] = shared_range{fd, ++reg.next_id, size, 0};
  }
  return std::shared_ptr<void>(p, [fd, size](void* q) {
    auto& r = shared_allocations();
    {
      std::lock_guard<std::mutex> g{r.mtx};
      r.live.erase(reinterpret_cast<std::uintptr_t>(q));
    }
    ::munmap(q, size);
    ::close(fd);
  });
}

std::optional<shared_range> find_shared(const void* p, std::size_t bytes) {
  auto& reg = shared_allocations();
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard<std::mutex> g{reg.mtx};
  auto i = reg.live.upper_bound(at);
  if (i == reg.live.begin()) return std::nullopt;
  --i;
  const auto offset = at - i->first;
  if (offset + bytes > i->second.size) return std::nullopt;
  auto r = i->second;
  r.offset = offset;
  return r;
}

std::optional<shared_range> share_in_place(const void* p, std::size_t bytes) {
  if (const char* e = std::getenv("TROUPE_SHARE_IN_PLACE"); e && std::string(e) == "off")
    return std::nullopt;
  auto& reg = shared_allocations();
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard<std::mutex> g{reg.mtx};
  auto it = reg.large_allocations.find(at);
  // Only a buffer that is the whole allocation: no other view of the
  // allocation is written while its pages are replaced.
  if (it == reg.large_allocations.end() || it->second.fd >= 0 || bytes > it->second.requested ||
      it->second.requested - bytes >= 64)
    return std::nullopt;
  // From the second use on: a buffer used once and freed would cost a copy
  // and keep the peers' mappings of it alive until they evict them.
  if (++it->second.uses < 2) return std::nullopt;
  // Each moved allocation keeps a descriptor open (the peers open it): at
  // most a quarter of the process's descriptors, and 256.
  rlimit limit{};
  const auto soft = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 ? limit.rlim_cur : rlim_t{1024};
  if (reg.moved >= static_cast<std::size_t>(std::min<rlim_t>(256, soft / 4))) return std::nullopt;
  const auto size = it->second.size;
  const auto [fd, fresh] = map_sealed_memfd(shared_tensor_memfd, size);
  if (fd < 0) return std::nullopt;  // out of descriptors, say: the buffer stays private
  // Moves the shared pages over the private ones a huge page at a time (same
  // address, same contents), so that no more than one piece is held twice.
  auto* from = static_cast<std::byte*>(fresh);
  auto* to = static_cast<std::byte*>(const_cast<void*>(p));
  const auto requested = it->second.requested;
  for (std::size_t off = 0; off < size; off += huge_page) {
    const auto piece = std::min(huge_page, size - off);
    if (off < requested) std::memcpy(from + off, to + off, std::min(piece, requested - off));
    if (::mremap(from + off, piece, piece, MREMAP_MAYMOVE | MREMAP_FIXED, to + off) == MAP_FAILED) {
      // The pieces moved so far hold the same contents: the buffer is intact,
      // partly in the memfd (kept alive by its mapping) and stays unshared.
      ::munmap(from + off, size - off);
      ::close(fd);
      return std::nullopt;
    }
  }
  it->second.fd = fd;
  ++reg.moved;
  auto r = shared_range{fd, ++reg.next_id, size, 0};
  reg.live[at] = r;
  return r;
}

std::optional<shared_range> find_or_share(const void* p, std::size_t bytes) {
  if (auto r = find_shared(p, bytes)) return r;
  return share_in_place(p, bytes);
}

}  // namespace troupe::detail
