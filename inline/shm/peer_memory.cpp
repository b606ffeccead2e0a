#include "inline/shm/peer_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "base/call.hpp"
#include "inline/shm/segment.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

peer_memory::~peer_memory() {
  for (auto& m : maps_) ::munmap(m.addr, m.size);
}

std::byte* peer_memory::map(int pid, const op_descriptor& d, const std::string& who) {
  ++clock_;
  auto hit = std::find_if(maps_.begin(), maps_.end(),
                          [&](const mapping& m) { return m.pid == pid && m.id == d.share_id; });
  if (hit == maps_.end()) {
    auto fail = [&](const char* what) {
      throw error(errc::backend, std::string(to_string(static_cast<op_code>(d.code))) +
                                     ": cannot " + std::string(what) + " the shared buffer of " +
                                     who + " (pid " + std::to_string(pid) + ", fd " +
                                     std::to_string(d.share_fd) + "): " + std::strerror(errno));
    };
    const auto path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(d.share_fd);
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) fail("open");
    void* p = ::mmap(nullptr, d.share_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) fail("map");
    if (maps_.size() >= max_) {
      auto lru = std::min_element(maps_.begin(), maps_.end(),
                                  [](auto& a, auto& b) { return a.used < b.used; });
      ::munmap(lru->addr, lru->size);
      maps_.erase(lru);
    }
    maps_.push_back({pid, d.share_id, static_cast<std::byte*>(p), d.share_size, 0});
    hit = maps_.end() - 1;
  }
  hit->used = clock_;
  if (d.share_offset + d.nbytes > hit->size)
    throw error(errc::internal, std::string(to_string(static_cast<op_code>(d.code))) +
                                    ": the shared buffer of " + who + " holds " +
                                    std::to_string(hit->size) + " bytes, not " +
                                    std::to_string(d.share_offset + d.nbytes));
  return hit->addr + d.share_offset;
}

}  // namespace troupe::detail
