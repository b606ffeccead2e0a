#pragma once
// host_memory — where tensor storage on the host comes from, and how ranks
// in other processes of this host get at it.
//
// Small buffers come from operator new. From 64 KiB every allocation is a
// mapping of its own: up to 2 MiB from a pool of freed buffers (one list per
// power of two), from 2 MiB 2 MiB aligned with huge pages asked for (up
// to 4 freed private ones, 128 MiB in all, kept for a request of the same
// size). All
// are registered, so that share_in_place can move one into shared memory
// (a memfd mapped at the same address) when a collective between processes
// uses it again. tensor::empty_shared memory is a memfd from the start. A
// forked child drops the pooled buffers that were shared (pthread_atfork).

#include <cstdint>
#include <memory>
#include <optional>

namespace troupe::detail {

/// From this size a host allocation of tensor::empty is a mapping of its own,
/// which share_in_place can move into shared memory.
inline constexpr std::size_t own_mapping_bytes = std::size_t{64} << 10;

/// Owned host memory of `bytes` (64-byte aligned; large buffers use huge pages).
std::shared_ptr<void> allocate_host(std::size_t bytes);
/// Host memory of tensor::empty_shared: `bytes` in a memfd mapped here.
std::shared_ptr<void> allocate_shared(std::size_t bytes);
/// Where a range of shared memory lives: the memfd `fd` of this process
/// (mapped whole, `size` bytes), allocation number `id` (never reused), and
/// the range's `offset` in it.
struct shared_range {
  int fd = -1;
  std::uint64_t id = 0;
  std::uint64_t size = 0;
  std::uint64_t offset = 0;
};
/// The shared allocation that holds all of [p, p + bytes), if any.
std::optional<shared_range> find_shared(const void* p, std::size_t bytes);
/// Moves a host allocation of tensor::empty (64 KiB or more: a mapping of its
/// own, pooled below 2 MiB) that is exactly [p, p + bytes) into shared
/// memory in place: its pages become a memfd's, mapped at the same address
/// with the same contents, so that ranks in other processes can map it (as
/// tensor::empty_shared memory). Only from the second call for the
/// allocation on (the first is counted). Empty when the range is not such an
/// allocation, on the first call, when it fails (the buffer stays private
/// and intact), when moved allocations hold 256 descriptors or a quarter of
/// RLIMIT_NOFILE, or with TROUPE_SHARE_IN_PLACE=off. A pooled buffer stays
/// shared when it is handed out again.
std::optional<shared_range> share_in_place(const void* p, std::size_t bytes);
/// [p, p + bytes) as peers can map it: find_shared's range, else share_in_place's.
std::optional<shared_range> find_or_share(const void* p, std::size_t bytes);

}  // namespace troupe::detail
