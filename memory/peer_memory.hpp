#pragma once
// peer_memory — buffers of ranks in other processes of this host, mapped into
// this one: tensor::empty_shared allocations (and large tensor::empty ones
// moved into shared memory in place) are memfds, which a peer opens through
// /proc/PID/fd/FD and maps. Then an allreduce between processes reads and
// writes the ranks' buffers directly, as ranks of one process do, instead of
// staging through the segment's slots, and a point-to-point message is
// copied once, from the sender's buffer into the receive's.
//
// Mappings are cached by (process, allocation number): a training loop that
// reuses its buffers maps each once. Allocation numbers are never reused, so a
// stale mapping (its owner freed the buffer) is never confused with a new one;
// the least recently used mappings beyond `max_mappings` are unmapped (an
// unmapped stale buffer releases its memory then).
//
// What a peer describes is checked before it is touched: the descriptor must
// open as a memfd sealed against shrinking (memory/host_memory seals every
// one it makes) of at least the size announced, and the range must lie in
// it; otherwise reading it could fault (SIGBUS past the end of a file).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::detail {

/// A range of a peer's shared buffer: its memfd in the peer's process, its
/// allocation number, the allocation's size, and the range's offset and bytes.
struct peer_buffer {
  int fd = -1;
  std::uint64_t id = 0;
  std::uint64_t size = 0;
  std::uint64_t offset = 0;
  std::uint64_t nbytes = 0;
};

class peer_memory {
 public:
  explicit peer_memory(std::size_t max_mappings = 32) : max_(max_mappings) {}
  ~peer_memory();
  peer_memory(const peer_memory&) = delete;
  peer_memory& operator=(const peer_memory&) = delete;

  /// The address in this process of the range `b` of process `pid`. Throws
  /// errc::backend naming `op` and `who` when it cannot be mapped or is not
  /// what it claims to be.
  std::byte* map(int pid, const peer_buffer& b, const char* op, const std::string& who);

 private:
  struct mapping {
    int pid;
    std::uint64_t id;
    std::byte* addr;
    std::uint64_t size;
    std::uint64_t used;  // last use, for eviction
  };
  std::size_t max_;
  std::uint64_t clock_ = 0;
  std::vector<mapping> maps_;
};

}  // namespace troupe::detail
