#include "memory/peer_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "memory/sealed_memfd.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

peer_memory::~peer_memory() {
  for (auto& m : maps_) ::munmap(m.addr, m.size);
}

std::byte* peer_memory::map(int pid, const peer_buffer& b, const char* op, const std::string& who) {
  ++clock_;
  const auto fail = [&](const std::string& what) {
    throw error(errc::backend, std::string(op) + ": cannot " + what + " the shared buffer of " +
                                   who + " (pid " + std::to_string(pid) + ", fd " +
                                   std::to_string(b.fd) + ")");
  };
  if (b.size == 0 || b.offset > b.size || b.nbytes > b.size - b.offset)
    fail("use a range of " + std::to_string(b.nbytes) + " bytes at " + std::to_string(b.offset) +
         " of " + std::to_string(b.size) + " bytes of");
  auto hit = std::find_if(maps_.begin(), maps_.end(),
                          [&](const mapping& m) { return m.pid == pid && m.id == b.id; });
  if (hit != maps_.end() && hit->size != b.size)
    fail("map " + std::to_string(b.size) + " bytes of a buffer of " + std::to_string(hit->size) +
         " bytes,");
  if (hit == maps_.end()) {
    std::size_t bytes = 0;
    std::string why;
    const int fd = open_sealed_memfd(pid, b.fd, b.size, shared_tensor_memfd, &bytes, &why);
    if (fd < 0) fail("use (" + why + ")");
    void* p = ::mmap(nullptr, b.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int mapped_errno = errno;
    ::close(fd);
    if (p == MAP_FAILED) fail(std::string("map (") + std::strerror(mapped_errno) + ")");
    if (maps_.size() >= max_) {
      auto lru = std::min_element(maps_.begin(), maps_.end(),
                                  [](auto& x, auto& y) { return x.used < y.used; });
      ::munmap(lru->addr, lru->size);
      maps_.erase(lru);
    }
    maps_.push_back({pid, b.id, static_cast<std::byte*>(p), b.size, 0});
    hit = maps_.end() - 1;
  }
  hit->used = clock_;
  return hit->addr + b.offset;
}

}  // namespace troupe::detail
