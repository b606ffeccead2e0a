#pragma once
// peer_memory — buffers of ranks in other processes of this host, mapped into
// this one: tensor::empty_shared allocations are memfds, which a peer opens
// through /proc/PID/fd/FD and maps. Then an allreduce between processes reads
// and writes the ranks' buffers directly, as ranks of one process do, instead
// of staging through the segment's slots.
//
// Mappings are cached by (process, allocation number): a training loop that
// reuses its buffers maps each once. Allocation numbers are never reused, so a
// stale mapping (its owner freed the buffer) is never confused with a new one;
// the least recently used mappings beyond `max_mappings` are unmapped (an
// unmapped stale buffer releases its memory then).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::detail {

struct op_descriptor;

class peer_memory {
 public:
  explicit peer_memory(std::size_t max_mappings = 32) : max_(max_mappings) {}
  ~peer_memory();
  peer_memory(const peer_memory&) = delete;
  peer_memory& operator=(const peer_memory&) = delete;

  /// The address in this process of the buffer that `d` describes, posted by
  /// process `pid`. Throws errc::backend naming `who` when it cannot be mapped.
  std::byte* map(int pid, const op_descriptor& d, const std::string& who);

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
