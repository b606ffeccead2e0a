// shm_ring: bytes go round a ring whole and in order, and each side keeps to
// its own mapping whatever the other process writes into the control block.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "../memory/sealed_memfd.hpp"
#include "../transport/shm_ring.hpp"
#include "troupe/error.hpp"

using troupe::detail::shm_ring;

namespace {

constexpr const char* prefix = "troupe-test-ring-";

std::string ring_name(const char* what) {
  return prefix + std::string(what) + "-" + std::to_string(::getpid());
}

/// The reader's side of `w` (in this process, as another process opens it).
std::unique_ptr<shm_ring> open_ring(const shm_ring& w) {
  return shm_ring::open(w.name(), ::getpid(), prefix);
}

/// The writer's descriptor of `w`, as /proc shows it to other processes.
std::string descriptor_path(const shm_ring& w) {
  std::string name;
  int pid = 0, fd = -1;
  REQUIRE(troupe::detail::parse_memfd_locator(w.name(), &name, &pid, &fd));
  return "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
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
  auto r = open_ring(*w);
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
  const int fd = ::open(descriptor_path(*w).c_str(), O_RDWR);
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
  auto r = open_ring(*w);
  CHECK(round_trips(*w, *r, 7000, 30));
  ::munmap(base, 4096);
}

TEST_CASE("read_some frees room when told: the writer sees it after publish_read") {
  const auto name = ring_name("publish");
  const std::uint64_t cap = std::uint64_t{64} << 10;
  auto w = shm_ring::create(name, cap);
  auto r = open_ring(*w);
  std::vector<char> bytes(100, 'x'), in(100);
  REQUIRE(w->write(bytes.data(), bytes.size()));
  CHECK(r->readable());
  CHECK(r->read_some(in.data(), in.size()) == 100);
  CHECK_FALSE(r->readable());  // read, though not yet told
  CHECK(w->writable() == cap - 100);
  r->publish_read();
  CHECK(w->writable() == cap);
  r->publish_read();  // nothing more to tell
  CHECK(w->writable() == cap);
  // Reads of a 16th of the ring or more tell the writer themselves.
  std::vector<char> big(cap / 2, 'y'), got(cap / 2);
  REQUIRE(w->write(big.data(), big.size()));
  std::size_t n = 0;
  while (n < got.size()) {
    const auto k = r->read_some(got.data() + n, got.size() - n);
    REQUIRE(k > 0);
    n += static_cast<std::size_t>(k);
  }
  CHECK(got == big);
  CHECK(w->writable() > cap / 2);
}

TEST_CASE("a writer that fills the ring gets all its bytes through read_some and publish_read") {
  const auto name = ring_name("stream");
  const std::uint64_t cap = std::uint64_t{64} << 10;
  auto w = shm_ring::create(name, cap);
  auto r = open_ring(*w);
  // Eight rings' worth in writes of uneven sizes; the reader takes small
  // pieces and tells the writer now after one (below a 16th of the ring:
  // told without a fence), now after several (told with one), as the data
  // plane does after a batch of frames. A lost wake-up would leave the
  // writer asleep (20 ms at a time).
  const std::size_t total = 8 * cap;
  auto byte_at = [](std::size_t i) { return static_cast<char>((i * 7 + i / 4093) % 251); };
  std::thread writer([&] {
    std::vector<char> out;
    for (std::size_t at = 0, step = 1; at < total; step = step * 5 % 9001 + 1) {
      const auto len = std::min(step, total - at);
      out.resize(len);
      for (std::size_t i = 0; i < len; ++i) out[i] = byte_at(at + i);
      if (!w->write(out.data(), len)) return;
      at += len;
    }
  });
  std::vector<char> piece(3000);
  std::size_t got = 0, wrong = 0;
  int reads = 0;
  while (got < total) {
    const auto k = r->read_some(piece.data(), piece.size());
    REQUIRE(k >= 0);
    for (long i = 0; i < k; ++i)
      if (piece[static_cast<std::size_t>(i)] != byte_at(got + static_cast<std::size_t>(i))) ++wrong;
    got += static_cast<std::size_t>(k);
    if (k == 0 || ++reads % 8 < 4 || reads % 8 == 7) r->publish_read();
    if (k == 0) std::this_thread::yield();
  }
  writer.join();
  CHECK(got == total);
  CHECK(wrong == 0);
}

TEST_CASE("a write to a full ring whose reader takes nothing ends at its deadline, ring open") {
  const auto name = ring_name("deadline");
  const std::uint64_t cap = std::uint64_t{64} << 10;
  auto w = shm_ring::create(name, cap);
  auto r = open_ring(*w);
  std::vector<char> bytes(cap + 100, 'x');
  const auto start = std::chrono::steady_clock::now();
  // More than the ring holds, its reader reading nothing: false at the
  // deadline (not at the 20 ms re-checks of a close, not never).
  std::size_t written = 0;
  CHECK_FALSE(
      w->write_until(bytes.data(), bytes.size(), start + std::chrono::milliseconds(150), &written));
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= std::chrono::milliseconds(150));
  CHECK(took < std::chrono::seconds(5));
  // It says how much went: what the ring held. The rest can follow once
  // the reader takes some (a write that told its stall at an earlier
  // deadline goes on so, transport/data_plane_send.cpp).
  CHECK(written == cap);
  std::vector<char> in(200);
  r->read(in.data(), in.size());
  CHECK(w->write_until(bytes.data() + written, bytes.size() - written,
                       std::chrono::steady_clock::now() + std::chrono::seconds(20), &written));
  CHECK(written == 100);
  // What fits goes in at once, a deadline already past or not.
  auto w2 = shm_ring::create(ring_name("deadline-fits"), cap);
  CHECK(w2->write_until(bytes.data(), 100, start));
  // Room made before the deadline lets the write finish.
  auto w3 = shm_ring::create(ring_name("deadline-room"), cap);
  auto r3 = open_ring(*w3);
  std::thread reader([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::vector<char> in(bytes.size());
    r3->read(in.data(), in.size());
  });
  CHECK(w3->write_until(bytes.data(), bytes.size(),
                        std::chrono::steady_clock::now() + std::chrono::seconds(20)));
  reader.join();
}

TEST_CASE("a reader waiting while bytes keep coming stays awake: its writer wakes it rarely") {
  const auto name = ring_name("linger");
  auto w = shm_ring::create(name, std::size_t{64} << 10);
  auto r = open_ring(*w);
  // A message every few microseconds, read as the data plane's reader
  // thread reads (wait_readable, then what is there). A reader that slept
  // at once would need a wake-up for nearly every message. The window is
  // longer than the data plane's (shm_ring::linger, 50 us), so that a
  // reader thread the scheduler leaves off its CPU meanwhile (ctest runs
  // other tests beside this one) does not fall asleep: the test is of the
  // lingering, not of the machine's load.
  constexpr int messages = 2000;
  std::thread reader([&] {
    char piece[64];
    for (int got = 0; got < messages;) {
      if (!r->wait_readable(std::chrono::milliseconds(100), std::chrono::milliseconds(100))) return;
      for (long k; (k = r->read_some(piece, sizeof piece)) > 0;) got += static_cast<int>(k);
      r->publish_read();
    }
  });
  const char one = 1;
  for (int i = 0; i < messages; ++i) {
    REQUIRE(w->write(&one, 1));
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(5);
    while (std::chrono::steady_clock::now() < until) {
    }
  }
  reader.join();
  CHECK(w->wakes_sent() < messages / 4);
  MESSAGE("wake-ups sent: " << w->wakes_sent() << " for " << messages << " messages");
}

TEST_CASE("no process can resize a ring under its sides' mappings") {
  auto w = shm_ring::create(ring_name("sealed"), std::size_t{64} << 10);
  const int fd = ::open(descriptor_path(*w).c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  // A truncated file would fault (SIGBUS) in every mapping past its end.
  CHECK(::ftruncate(fd, 4096) != 0);
  CHECK(errno == EPERM);
  CHECK(::ftruncate(fd, std::int64_t{1} << 30) != 0);
  ::close(fd);
  auto r = open_ring(*w);
  CHECK(round_trips(*w, *r, 7000, 30));
  // Once the reader opened it, the writer lets go of its descriptor:
  // nothing can open the ring any more.
  const auto path = descriptor_path(*w);
  w->opened_by_reader();
  CHECK_THROWS_AS(open_ring(*w), troupe::error);
  CHECK(::open(path.c_str(), O_RDWR) < 0);
  CHECK(round_trips(*w, *r, 7000, 3));
}

TEST_CASE("a reader refuses what is not a sealed ring of the named process, saying why") {
  auto w = shm_ring::create(ring_name("refuse"), std::size_t{64} << 10);
  auto refused = [](const std::string& name, int pid, const std::string& expect) {
    CAPTURE(name);
    try {
      shm_ring::open(name, pid, prefix);
      FAIL("opened");
    } catch (const troupe::error& e) {
      CHECK(std::string(e.what()).find(expect) != std::string::npos);
    }
  };
  const auto me = std::to_string(::getpid());
  refused("not a locator", ::getpid(), "does not name a ring");
  refused("other-prefix@" + me + ":3", ::getpid(), "does not name a ring");
  refused(w->name(), ::getpid() + 1, "is not of process");
  // Another descriptor of this process (a plain file), under a ring's name.
  const int null_fd = ::open("/dev/null", O_RDONLY);
  REQUIRE(null_fd >= 0);
  refused(std::string(prefix) + "x@" + me + ":" + std::to_string(null_fd), ::getpid(),
          "is not the memfd");
  ::close(null_fd);
  // A memfd of that name that anyone could shrink.
  const int loose = ::memfd_create((std::string(prefix) + "loose").c_str(), MFD_CLOEXEC);
  REQUIRE(loose >= 0);
  REQUIRE(::ftruncate(loose, 1 << 16) == 0);
  refused(std::string(prefix) + "loose@" + me + ":" + std::to_string(loose), ::getpid(),
          "is not a sealed memfd");
  ::close(loose);
  refused(std::string(prefix) + "gone@" + me + ":999999", ::getpid(), "cannot open");
}

TEST_CASE("a ring that carries only a few small frames takes no memory for the rest") {
  // Every pair of ranks of a host has a ring: most carry nothing but the
  // goodbye at the end, which must not allocate (and zero) the whole ring.
  // One in real use is mapped at once (faults one page at a time slow it).
  const auto name = ring_name("lazy");
  constexpr std::size_t capacity = std::size_t{4} << 20;
  auto w = shm_ring::create(name, capacity);
  auto r = open_ring(*w);
  struct stat st {};
  auto allocated = [&] {
    REQUIRE(::stat(descriptor_path(*w).c_str(), &st) == 0);
    return static_cast<std::size_t>(st.st_blocks) * 512;
  };
  CHECK(round_trips(*w, *r, 16, 4));
  CHECK(allocated() < capacity / 8);
  CHECK(round_trips(*w, *r, 64 << 10, 16));  // 1 MiB through: in use
  CHECK(allocated() >= capacity);
}
