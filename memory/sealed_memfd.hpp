#pragma once
// sealed_memfd — shared memory that no process can resize: a memfd sealed
// against shrinking and growing, which other processes of the host open
// through /proc/PID/fd/FD. A mapping of a file that a peer truncated faults
// (SIGBUS) on the pages past its new end; a sealed memfd cannot be
// truncated, so what a peer maps stays readable for as long as it is mapped.
// The shared tensors (memory/host_memory), the rings between processes
// (transport/shm_ring) and the inline engine's segment (inline/shm/segment) are
// made this way; peer_memory and the rings and segment open them with
// open_sealed_memfd, which checks the seals, the size and the name.

#include <cstddef>
#include <string>

namespace troupe::detail {

/// The name of the memfds behind shared tensors (tensor::empty_shared, and
/// large allocations shared in place), which peers map.
inline constexpr const char* shared_tensor_memfd = "troupe-shared-tensor";

/// A new memfd of `bytes` bytes named `name` (what /proc shows after
/// "/memfd:"), sealed against resizing: its descriptor, or -1 with errno set.
int sealed_memfd(const std::string& name, std::size_t bytes);

/// A new sealed memfd (as sealed_memfd) mapped here whole, shared and
/// writable: its descriptor and address. When it cannot be made or mapped,
/// fd is -1 and errno says why (nothing is left open).
struct sealed_mapping {
  int fd = -1;
  void* addr = nullptr;
};
sealed_mapping map_sealed_memfd(const std::string& name, std::size_t bytes);

/// Opens descriptor `fd` of process `pid` for reading and writing, when it
/// is a memfd sealed against shrinking of at least `min_bytes` bytes (and,
/// unless `name` is empty, made by sealed_memfd with that name): the new
/// descriptor, with its size in `*bytes`. Otherwise -1, and `why` says what
/// was wrong ("cannot open ...: No such file or directory", "not a sealed
/// memfd ...").
int open_sealed_memfd(int pid, int fd, std::size_t min_bytes, const std::string& name,
                      std::size_t* bytes, std::string* why);

/// Where another process finds a memfd of this one: "NAME@PID:FD".
std::string memfd_locator(const std::string& name, int fd);
/// Reads a locator back; false when `text` is not one.
bool parse_memfd_locator(const std::string& text, std::string* name, int* pid, int* fd);

}  // namespace troupe::detail
