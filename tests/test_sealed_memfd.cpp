// sealed_memfd: shared memory no process can resize, found by a locator
// that a reader checks before it maps anything; peer_memory maps a peer's
// buffer only when it is a sealed shared tensor of at least the size told.

#include <doctest/doctest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "../memory/host_memory.hpp"
#include "../memory/peer_memory.hpp"
#include "../memory/sealed_memfd.hpp"
#include "troupe/error.hpp"
#include "troupe/tensor.hpp"

using namespace troupe::detail;

TEST_CASE("a sealed memfd keeps its size whatever any process asks") {
  const int fd = sealed_memfd("troupe-test-sealed", 1 << 16);
  REQUIRE(fd >= 0);
  CHECK(::ftruncate(fd, 4096) != 0);
  CHECK(errno == EPERM);
  CHECK(::ftruncate(fd, 1 << 20) != 0);
  std::size_t bytes = 0;
  std::string why;
  const int again = open_sealed_memfd(::getpid(), fd, 1 << 16, "troupe-test-sealed", &bytes, &why);
  CHECK(again >= 0);
  CHECK(bytes == std::size_t{1} << 16);
  CHECK(why.empty());
  // More than it holds, or under another name: refused, saying why.
  CHECK(open_sealed_memfd(::getpid(), fd, 1 << 17, {}, &bytes, &why) < 0);
  CHECK(why.find("not a sealed memfd of at least 131072 bytes") != std::string::npos);
  CHECK(open_sealed_memfd(::getpid(), fd, 1, "troupe-other", &bytes, &why) < 0);
  CHECK(why.find("is not the memfd 'troupe-other'") != std::string::npos);
  CHECK(open_sealed_memfd(-4, fd, 1, {}, &bytes, &why) < 0);
  CHECK(why.find("process -4") != std::string::npos);
  if (again >= 0) ::close(again);
  ::close(fd);
}

TEST_CASE("locators read back what they wrote, and nothing else") {
  std::string name;
  int pid = 0, fd = -1;
  REQUIRE(parse_memfd_locator(memfd_locator("troupe-ring-1-2", 7), &name, &pid, &fd));
  CHECK(name == "troupe-ring-1-2");
  CHECK(pid == ::getpid());
  CHECK(fd == 7);
  REQUIRE(parse_memfd_locator("a@b@12:3", &name, &pid, &fd));  // the last '@' counts
  CHECK(name == "a@b");
  for (const char* bad : {"", "name", "name@12", "@12:3", "name@:3", "name@12:", "name@1x:3",
                          "name@12:-3", "name@12:3:4", "name@99999999999:3", "name:3@12"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_memfd_locator(bad, &name, &pid, &fd));
  }
}

TEST_CASE("a peer's buffer is mapped only when it is a sealed shared tensor") {
  peer_memory peers;
  // A memfd of this process that is not a shared tensor (a ring, say).
  const int other = sealed_memfd("troupe-ring-0-1", 1 << 16);
  REQUIRE(other >= 0);
  peer_buffer b;
  b.fd = other;
  b.id = 1;
  b.size = b.nbytes = 1 << 16;
  try {
    peers.map(::getpid(), b, "recv", "rank 1");
    FAIL("mapped");
  } catch (const troupe::error& e) {
    const std::string what = e.what();
    CHECK(what.find("recv: cannot use") != std::string::npos);
    CHECK(what.find("is not the memfd 'troupe-shared-tensor'") != std::string::npos);
    CHECK(what.find("rank 1") != std::string::npos);
  }
  ::close(other);
  // A real shared tensor maps, but not past its end.
  auto t = troupe::tensor::empty_shared({1024}, troupe::dtype::float32);
  auto where = find_shared(t.data(), t.nbytes());
  REQUIRE(where.has_value());
  b.fd = where->fd;
  b.id = where->id;
  b.size = where->size;
  b.offset = where->offset;
  b.nbytes = t.nbytes();
  CHECK(peers.map(::getpid(), b, "recv", "rank 1") != nullptr);
  b.id = 2;
  b.size = where->size * 2;
  b.nbytes = b.size - b.offset;
  CHECK_THROWS_AS(peers.map(::getpid(), b, "recv", "rank 1"), troupe::error);
}

TEST_CASE("a peer's buffer whose process ended is a peer failure that says so") {
  // A lender that dies after lending: the receiver may try its buffer
  // before it heard of the death. That is the peer's failure, not the
  // backend's, whether the process is still a zombie or already reaped.
  for (bool reaped : {false, true}) {
    CAPTURE(reaped);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      sealed_memfd(shared_tensor_memfd, 1 << 16);
      ::_exit(0);
    }
    int status = 0;
    if (reaped) {
      ::waitpid(child, &status, 0);
    } else {
      siginfo_t info{};
      ::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT);  // stays a zombie
    }
    peer_memory peers;
    peer_buffer b;
    b.fd = 3;
    b.id = 1;
    b.size = b.nbytes = 1 << 16;
    try {
      peers.map(static_cast<int>(child), b, "recv", "rank 1");
      FAIL("mapped");
    } catch (const troupe::error& e) {
      const std::string what = e.what();
      CHECK(e.code() == troupe::errc::peer_failure);
      CHECK(what.find("rank 1") != std::string::npos);
      CHECK(what.find("its process ended") != std::string::npos);
    }
    if (!reaped) ::waitpid(child, &status, 0);
  }
}
