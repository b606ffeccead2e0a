#pragma once
// stream_copy — copies whose destination bypasses the caches.
//
// An ordinary store first reads the line it writes (read for ownership);
// non-temporal stores do not, and do not evict what the caches hold. Where
// a collective writes more output than the caches can keep (its outputs
// together larger than the last-level cache), that output would reach
// memory before anyone reads it anyway: streaming it moves a third less.

#include <cstddef>

namespace troupe::detail {

/// memcpy(dst, src, n) with non-temporal stores where the CPU has them (the
/// ends that are not whole cache lines, and other CPUs, use memcpy). The
/// stores are weakly ordered: call stream_fence() before telling another
/// thread or process that the bytes are there.
void stream_copy(void* dst, const void* src, std::size_t n) noexcept;
/// Orders every stream_copy() of this thread before its later stores.
void stream_fence() noexcept;

/// The last-level cache's size in bytes (sysfs, else sysconf; 32 MiB when
/// unknown).
std::size_t last_level_cache_bytes() noexcept;

/// Outputs of at least this many bytes in all (the host's ranks' together)
/// are streamed: the last-level cache's size, unless set.
std::size_t stream_threshold() noexcept;
/// Sets stream_threshold() (0: back to the cache's size); for tests.
void set_stream_threshold(std::size_t bytes) noexcept;

}  // namespace troupe::detail
