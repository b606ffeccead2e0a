// troupe::tensor: owned, borrowed and adopted memory; views, copies, errors.

#include "troupe/tensor.hpp"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>

#include <cstdlib>

#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <utility>

#include "src/device_memory.hpp"
#include "tensor_util.hpp"
#include "troupe/error.hpp"

namespace troupe {
namespace detail {

std::string format_shape(const shape_t& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::int64_t checked_numel(const char* op, const shape_t& shape) {
  std::int64_t n = 1;
  for (auto d : shape) {
    if (d < 0)
      throw error(errc::invalid_argument, std::string(op) + ": negative dimension " +
                                              std::to_string(d) + " in shape " +
                                              format_shape(shape));
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d)
      throw error(errc::invalid_argument,
                  std::string(op) + ": shape " + format_shape(shape) + " has too many elements");
    n *= d;
  }
  return n;
}

shape_t contiguous_strides(const shape_t& shape) {
  shape_t strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i] > 0 ? shape[i] : 1;
  }
  return strides;
}

namespace {

std::string errno_text() {
  return std::strerror(errno);
}

// Stands in for the address of zero-element tensors whose memory pointer is null,
// so that such tensors are still defined().
alignas(64) unsigned char empty_sentinel[64];

// Calls `f(byte_offset)` for every element in row-major order.
template <class F>
void for_each_offset(const shape_t& shape, const shape_t& strides, std::size_t elem, F&& f) {
  const std::size_t nd = shape.size();
  std::vector<std::int64_t> index(nd, 0);
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  std::int64_t off = 0;  // in elements
  for (std::int64_t k = 0; k < n; ++k) {
    f(off * static_cast<std::int64_t>(elem));
    for (std::size_t i = nd; i-- > 0;) {
      if (++index[i] < shape[i]) {
        off += strides[i];
        break;
      }
      off -= strides[i] * (shape[i] - 1);
      index[i] = 0;
    }
  }
}

}  // namespace

std::vector<std::int64_t> split_elements(const tensor& t, const std::vector<std::int64_t>& splits,
                                         int size) {
  const auto rows = t.dim() == 0 ? 1 : t.shape()[0];
  const auto row = rows == 0 ? 0 : t.numel() / rows;
  std::vector<std::int64_t> r;
  for (int p = 0; p < size; ++p)
    r.push_back(splits.empty() ? t.numel() / size : splits[static_cast<std::size_t>(p)] * row);
  return r;
}

namespace {

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

/// Unmaps a mapping of its own and forgets it (closing its memfd, if it was
/// shared in place).
void unmap_mapping(void* p, std::size_t size) {
  auto& reg = shared_allocations();
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  int fd = -1;
  {
    std::lock_guard<std::mutex> g{reg.mtx};
    if (auto it = reg.large_allocations.find(at); it != reg.large_allocations.end()) {
      fd = it->second.fd;
      reg.moved -= fd >= 0;
      reg.large_allocations.erase(it);
    }
    reg.live.erase(at);
  }
  ::munmap(p, size);
  if (fd >= 0) ::close(fd);
}

/// Buffers from 64 KiB up to 2 MiB (segments of pipelined collectives,
/// received frames, middle-sized tensors) come from a small cache of freed
/// ones, one list per power of two: each fresh buffer pays its page faults
/// and zeroing (measured: a sixth of a 64 MiB TCP allreduce; a 16 MiB TCP
/// broadcast, whose receiver holds 16 segments at once, spent 15 % of its
/// samples zeroing pages with 8 kept). Per size, up to 16 MiB of buffers are
/// kept (at least 8). Each is a mapping of its own (registered, so that
/// share_in_place can move it into shared memory; a buffer shared so stays
/// shared when it is handed out again).
constexpr std::size_t pooled_min = std::size_t{64} << 10;
constexpr int pool_classes = 6;  // 64 KiB .. 2 MiB (exclusive)
constexpr std::size_t pool_depth(int cls) {
  return std::max<std::size_t>(8, (std::size_t{16} << 20) / (pooled_min << cls));
}

struct buffer_pool {
  std::mutex mtx;
  std::vector<void*> free[pool_classes];
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
  for (auto& list : bp.free)
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](void* q) {
                                const auto at = reinterpret_cast<std::uintptr_t>(q);
                                auto it = reg.large_allocations.find(at);
                                if (it == reg.large_allocations.end() || it->second.fd < 0)
                                  return false;
                                ::munmap(q, it->second.size);
                                ::close(it->second.fd);
                                --reg.moved;
                                reg.large_allocations.erase(it);
                                reg.live.erase(at);
                                return true;
                              }),
               list.end());
  reg.mtx.unlock();
  bp.mtx.unlock();
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
    }
  }
  if (p) {
    // Handed out again: a new owner, whose uses count afresh.
    auto& reg = shared_allocations();
    std::lock_guard<std::mutex> g{reg.mtx};
    auto& entry = reg.large_allocations[reinterpret_cast<std::uintptr_t>(p)];
    entry.requested = bytes;
    entry.uses = 0;
  } else {
    p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc{};
    register_mapping(p, bytes, size);
  }
  return std::shared_ptr<void>(p, [cls, size](void* q) {
    auto& bp = pool();
    {
      std::lock_guard<std::mutex> g{bp.mtx};
      if (bp.free[cls].size() < pool_depth(cls)) {
        bp.free[cls].push_back(q);
        return;
      }
    }
    unmap_mapping(q, size);
  });
}

}  // namespace

std::shared_ptr<void> allocate_host(std::size_t bytes) {
  // Large buffers are 2 MiB aligned and asked to use huge pages: a fresh
  // 64 MiB buffer then costs 32 page faults instead of 16384 (received
  // frames and collective results are fresh buffers). Each is a mapping of
  // its own, so that share_in_place can replace its pages.
  if (bytes >= huge_page) {
    const std::size_t size = (bytes + huge_page - 1) / huge_page * huge_page;
    void* p = map_large(size);
    register_mapping(p, bytes, size);
    return std::shared_ptr<void>(p, [size](void* q) { unmap_mapping(q, size); });
  }
  if (bytes >= pooled_min) return pooled(bytes);
  constexpr std::align_val_t align{64};
  void* p = ::operator new(bytes ? bytes : 64, align);
  return std::shared_ptr<void>(p, [](void* q) { ::operator delete (q, std::align_val_t{64}); });
}

std::shared_ptr<void> allocate_shared(std::size_t bytes) {
  const std::size_t size = std::max<std::size_t>(bytes, 64);
  const int fd = ::memfd_create("troupe-shared-tensor", MFD_CLOEXEC);
  if (fd < 0)
    throw error(errc::backend, "tensor.empty_shared: memfd_create failed: " + errno_text());
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const auto why = errno_text();
    ::close(fd);
    throw error(errc::backend, "tensor.empty_shared: cannot size " + std::to_string(size) +
                                   " bytes of shared memory: " + why);
  }
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
  const int fd = ::memfd_create("troupe-shared-tensor", MFD_CLOEXEC);
  if (fd < 0) return std::nullopt;  // out of descriptors, say: the buffer stays private
  void* fresh = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(size)) == 0)
    fresh = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (fresh == MAP_FAILED) {
    ::close(fd);
    return std::nullopt;
  }
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

std::shared_ptr<void> non_null_base(std::shared_ptr<void> owner, void* data) {
  return std::shared_ptr<void>(std::move(owner), data ? data : empty_sentinel);
}

}  // namespace detail

namespace {

std::string fmt(const char* op, const std::string& rest) {
  return std::string(op) + ": " + rest;
}

[[noreturn]] void invalid(const char* op, const std::string& rest) {
  throw error(errc::invalid_argument, fmt(op, rest));
}

void check_data(const char* op, const void* data, std::int64_t numel) {
  if (!data && numel > 0)
    invalid(op, "null data pointer for " + std::to_string(numel) + " elements");
}

}  // namespace

tensor tensor::make(std::shared_ptr<void> base, std::size_t offset, shape_t shape, shape_t strides,
                    dtype t, device d) {
  tensor r;
  r.base_ = std::move(base);
  r.offset_ = offset;
  r.shape_ = std::move(shape);
  r.strides_ = std::move(strides);
  r.dtype_ = t;
  r.device_ = d;
  return r;
}

namespace {

/// Bytes of contiguous storage for `shape` of `t`, rounded up to whole cache
/// lines so that vectorised kernels may touch the tail; errors name `op`.
std::size_t storage_bytes(const char* op, const shape_t& shape, dtype t) {
  const auto n = detail::checked_numel(op, shape);
  const auto elem = troupe::element_size(t);
  if (static_cast<std::uint64_t>(n) > std::numeric_limits<std::size_t>::max() / 2 / elem)
    invalid(op, "shape " + detail::format_shape(shape) + " is too large");
  return (static_cast<std::size_t>(n) * elem + 63) / 64 * 64;
}

}  // namespace

tensor tensor::empty(shape_t shape, dtype t, device d) {
  const auto bytes = storage_bytes("tensor.empty", shape, t);
  std::shared_ptr<void> base = d.type == device_type::cpu
                                   ? detail::allocate_host(bytes)
                                   : detail::gpu::allocate("tensor.empty", d, bytes);
  auto strides = detail::contiguous_strides(shape);
  return make(std::move(base), 0, std::move(shape), std::move(strides), t, d);
}

tensor tensor::empty_shared(shape_t shape, dtype t) {
  auto base = detail::allocate_shared(storage_bytes("tensor.empty_shared", shape, t));
  auto strides = detail::contiguous_strides(shape);
  return make(std::move(base), 0, std::move(shape), std::move(strides), t, device::cpu());
}

tensor tensor::zeros(shape_t shape, dtype t, device d) {
  if (d.type != device_type::cpu) detail::gpu::check_device("tensor.zeros", d);
  auto r = empty(std::move(shape), t, d);
  if (d.type == device_type::cpu)
    std::memset(r.data(), 0, r.nbytes());
  else
    detail::gpu::zero("tensor.zeros", d, r.data(), r.nbytes());
  return r;
}

tensor tensor::from_blob(void* data, shape_t shape, dtype t, device d) {
  const auto n = detail::checked_numel("tensor.from_blob", shape);
  check_data("tensor.from_blob", data, n);
  auto strides = detail::contiguous_strides(shape);
  return make(detail::non_null_base(nullptr, data), 0, std::move(shape), std::move(strides), t, d);
}

tensor tensor::from_blob(void* data, shape_t shape, shape_t strides, dtype t, device d) {
  const auto n = detail::checked_numel("tensor.from_blob", shape);
  check_data("tensor.from_blob", data, n);
  if (strides.size() != shape.size())
    invalid("tensor.from_blob", "strides " + detail::format_shape(strides) +
                                    " do not match shape " + detail::format_shape(shape));
  return make(detail::non_null_base(nullptr, data), 0, std::move(shape), std::move(strides), t, d);
}

tensor tensor::adopt(void* data, shape_t shape, dtype t, std::function<void(void*)> deleter,
                     device d) {
  const auto n = detail::checked_numel("tensor.adopt", shape);
  check_data("tensor.adopt", data, n);
  std::shared_ptr<void> owner(data, [del = std::move(deleter)](void* p) {
    if (del) del(p);
  });
  auto strides = detail::contiguous_strides(shape);
  return make(detail::non_null_base(std::move(owner), data), 0, std::move(shape),
              std::move(strides), t, d);
}

std::int64_t tensor::numel() const noexcept {
  if (!defined()) return 0;
  std::int64_t n = 1;
  for (auto d : shape_) n *= d;
  return n;
}

std::size_t tensor::element_size() const noexcept {
  return troupe::element_size(dtype_);
}

bool tensor::is_contiguous() const noexcept {
  std::int64_t expected = 1;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 0) return true;
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* tensor::data() const noexcept {
  if (!base_) return nullptr;
  return static_cast<char*>(base_.get()) + offset_;
}

tensor tensor::clone() const {
  if (!defined()) invalid("tensor.clone", "undefined tensor");
  if (!is_cpu() && !is_contiguous())
    invalid("tensor.clone", describe() + ": strided CUDA tensors cannot be cloned");
  auto r = empty(shape_, dtype_, device_);
  if (!is_cpu()) {
    detail::gpu::copy("tensor.clone", r.data(), data(), nbytes());
  } else if (is_contiguous()) {
    copy_bytes(r.data(), data(), nbytes());
  } else {
    auto* dst = static_cast<char*>(r.data());
    const auto* src = static_cast<const char*>(data());
    const auto elem = element_size();
    detail::for_each_offset(shape_, strides_, elem, [&](std::int64_t off) {
      std::memcpy(dst, src + off, elem);
      dst += elem;
    });
  }
  return r;
}

void tensor::copy_from(const tensor& src) {
  if (!defined() || !src.defined()) invalid("tensor.copy_from", "undefined tensor");
  if (src.dtype_ != dtype_)
    invalid("tensor.copy_from", "dtype mismatch " + std::string(to_string(dtype_)) + " vs " +
                                    std::string(to_string(src.dtype_)));
  if (src.numel() != numel())
    invalid("tensor.copy_from",
            "numel mismatch " + std::to_string(numel()) + " vs " + std::to_string(src.numel()));
  if (!is_contiguous())
    invalid("tensor.copy_from", "destination " + describe() + " is not contiguous");
  if (!src.is_contiguous())
    invalid("tensor.copy_from", "source " + src.describe() + " is not contiguous");
  if (data() == src.data()) return;
  if (is_cpu() && src.is_cpu())
    std::memmove(data(), src.data(), nbytes());
  else
    detail::gpu::copy("tensor.copy_from", data(), src.data(), nbytes());
}

void tensor::zero_() {
  if (!defined()) invalid("tensor.zero_", "undefined tensor");
  if (!is_cpu()) {
    if (!is_contiguous())
      invalid("tensor.zero_", describe() + ": strided CUDA tensors cannot be zeroed");
    detail::gpu::zero("tensor.zero_", device_, data(), nbytes());
    return;
  }
  if (is_contiguous()) {
    if (nbytes()) std::memset(data(), 0, nbytes());
    return;
  }
  auto* p = static_cast<char*>(data());
  const auto elem = element_size();
  detail::for_each_offset(shape_, strides_, elem,
                          [&](std::int64_t off) { std::memset(p + off, 0, elem); });
}

tensor tensor::flat_slice(std::int64_t offset, std::int64_t count) const {
  if (!defined()) invalid("tensor.flat_slice", "undefined tensor");
  if (!is_contiguous()) invalid("tensor.flat_slice", describe() + " is not contiguous");
  const auto n = numel();
  if (offset < 0 || count < 0 || offset > n || count > n - offset)
    invalid("tensor.flat_slice", "range [" + std::to_string(offset) + ", " +
                                     std::to_string(offset + count) + ") outside " +
                                     std::to_string(n) + " elements");
  auto r = *this;
  r.offset_ += static_cast<std::size_t>(offset) * element_size();
  r.shape_ = {count};
  r.strides_ = {1};
  return r;
}

tensor tensor::view(shape_t shape) const {
  if (!defined()) invalid("tensor.view", "undefined tensor");
  if (!is_contiguous()) invalid("tensor.view", describe() + " is not contiguous");
  const auto n = numel();
  // One dimension may be -1: inferred from the others.
  int inferred = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && inferred < 0) {
      inferred = static_cast<int>(i);
    } else if (shape[i] < 0) {
      invalid("tensor.view", "invalid dimension " + std::to_string(shape[i]) + " in shape " +
                                 detail::format_shape(shape));
    } else {
      known *= shape[i];
    }
  }
  if (inferred >= 0) {
    if (known == 0 || n % known != 0)
      invalid("tensor.view", "shape " + detail::format_shape(shape) + " is invalid for " +
                                 std::to_string(n) + " elements");
    shape[static_cast<std::size_t>(inferred)] = n / known;
  }
  const auto m = detail::checked_numel("tensor.view", shape);
  if (m != n)
    invalid("tensor.view", "shape " + detail::format_shape(shape) + " has " + std::to_string(m) +
                               " elements, tensor has " + std::to_string(n));
  auto r = *this;
  r.strides_ = detail::contiguous_strides(shape);
  r.shape_ = std::move(shape);
  return r;
}

bool tensor::is_same(const tensor& other) const noexcept {
  if (defined() != other.defined()) return false;
  return data() == other.data() && nbytes() == other.nbytes();
}

std::string tensor::describe() const {
  if (!defined()) return "tensor(undefined)";
  std::string s = "tensor(" + std::string(to_string(dtype_)) + ", " + to_string(device_) + ", " +
                  detail::format_shape(shape_);
  if (!is_contiguous()) s += ", strides " + detail::format_shape(strides_);
  return s + ")";
}

void tensor::copy_bytes(void* dst, const void* src, std::size_t n) {
  if (n) std::memcpy(dst, src, n);
}

void tensor::check_element_type(dtype t) const {
  if (!defined()) invalid("tensor.to_vector", "undefined tensor");
  if (t != dtype_)
    invalid("tensor.to_vector", "dtype mismatch " + std::string(to_string(dtype_)) + " vs " +
                                    std::string(to_string(t)));
  if (!is_contiguous()) invalid("tensor.to_vector", describe() + " is not contiguous");
}

void tensor::read_into(void* host, std::size_t n) const {
  if (n == 0) return;
  if (is_cpu())
    copy_bytes(host, data(), n);
  else
    detail::gpu::copy("tensor.to_vector", host, data(), n);
}

}  // namespace troupe
