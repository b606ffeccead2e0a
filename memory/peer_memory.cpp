#include "memory/peer_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "memory/sealed_memfd.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

peer_memory::~peer_memory() {
  for (auto& m : maps_) ::munmap(m.addr, m.size);
}

namespace {

/// Whether process `pid` ended: no such process, or a zombie (state Z or X
/// in /proc/PID/stat; its descriptors are closed).
bool process_ended(int pid) {
  if (pid <= 0) return false;
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return errno == ENOENT;
  char line[512] = {};
  const bool read = std::fgets(line, sizeof(line), f) != nullptr;
  std::fclose(f);
  const char* close = read ? std::strrchr(line, ')') : nullptr;
  return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

}  // namespace

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
    if (fd < 0) {
      // A peer that died (a lender, say) before this process heard so:
      // its failure, named as such, not a fault of the buffer.
      if (process_ended(pid))
        throw error(errc::peer_failure, std::string(op) + ": the shared buffer of " + who +
                                            " is gone: its process ended (pid " +
                                            std::to_string(pid) + ")");
      fail("use (" + why + ")");
    }
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
