// shm_ring: bytes go round a ring whole and in order, and each side keeps to
// its own mapping whatever the other process writes into the control block.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../transport/shm_ring.hpp"

using troupe::detail::shm_ring;

namespace {

std::string ring_name(const char* what) {
  return "/troupe-test-ring-" + std::string(what) + "-" + std::to_string(::getpid());
}

/// Writes `rounds` messages of `size` bytes and reads each back: true when
/// every one arrived as written.
bool round_trips(shm_ring& w, shm_ring& r, std::size_t size, int rounds) {
  std::vector<char> out(size), in(size);
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t i = 0; i < size; ++i) out[i] = static_cast<char>(round * 31 + i % 251);
    if (!w.write(out.data(), out.size()) || !r.read(in.data(), in.size()) || in != out)
      return false;
  }
  return true;
}

}  // namespace

TEST_CASE("bytes go round a ring several times, whole and in order") {
  const auto name = ring_name("order");
  auto w = shm_ring::create(name, std::size_t{64} << 10);
  auto r = shm_ring::open(name);
  // Pieces that do not divide the ring: they cross its end.
  CHECK(round_trips(*w, *r, 7000, 30));
  CHECK(round_trips(*w, *r, 1, 100));
}

TEST_CASE("a ring's sides keep to their mapping whatever capacity its control block claims") {
  const auto name = ring_name("capacity");
  const std::uint64_t cap = std::uint64_t{64} << 10;
  auto w = shm_ring::create(name, cap);
  // Another process claims a capacity a thousand times the ring's: the one
  // word of the control block that holds the capacity at creation.
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  REQUIRE(fd >= 0);
  void* base = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  REQUIRE(base != MAP_FAILED);
  auto* words = static_cast<std::uint64_t*>(base);
  int found = 0;
  for (int i = 0; i < 512; ++i)
    if (words[i] == cap) {
      words[i] = cap * 1000;
      ++found;
    }
  REQUIRE(found == 1);
  auto r = shm_ring::open(name);
  CHECK(round_trips(*w, *r, 7000, 30));
  ::munmap(base, 4096);
}
