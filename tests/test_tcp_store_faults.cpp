// Tests that a tcp_store_server survives misbehaving peers: a client process
// killed with SIGKILL while it waits, and raw sockets that send garbage or
// truncated BASP headers. After each, proper clients keep working.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/tcp_store.hpp"

using namespace std::chrono_literals;

namespace {

const std::string token = "job-secret-2";

troupe::tcp_store_options client_options() {
  troupe::tcp_store_options o;
  o.token = token;
  o.timeout = 10s;
  return o;
}

/// A proper client does a round of calls, including a blocking get released by a second client.
void check_serving(std::uint16_t port, const std::string& tag) {
  troupe::tcp_store a("127.0.0.1", port, client_options());
  troupe::tcp_store b("127.0.0.1", port, client_options());
  a.set(tag, "ok");
  CHECK(b.get_string(tag) == "ok");
  CHECK(a.add(tag + "/n", 2) == 2);
  std::thread setter([&] {
    std::this_thread::sleep_for(20ms);
    b.set(tag + "/late", "x");
  });
  CHECK(a.get_string(tag + "/late") == "x");
  setter.join();
}

/// Connects a raw TCP socket to the server, writes `data`, optionally waits, then closes.
void send_raw(std::uint16_t port, const std::vector<std::uint8_t>& data,
              std::chrono::milliseconds linger = 0ms) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  std::size_t off = 0;
  while (off < data.size()) {
    auto n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may close on the first bad header
    off += static_cast<std::size_t>(n);
  }
  std::this_thread::sleep_for(linger);
  ::close(fd);
}

/// A 32-byte BASP header (CAF 0.17 layout, network byte order): operation, two
/// padding bytes, flags, payload length, operation data, source and destination actor.
std::vector<std::uint8_t> basp_header(std::uint8_t operation, std::uint32_t payload_len,
                                      std::uint64_t operation_data) {
  std::vector<std::uint8_t> h(32, 0);
  h[0] = operation;
  for (int i = 0; i < 4; ++i) h[4 + i] = static_cast<std::uint8_t>(payload_len >> (24 - 8 * i));
  for (int i = 0; i < 8; ++i) h[8 + i] = static_cast<std::uint8_t>(operation_data >> (56 - 8 * i));
  return h;
}

/// A memory figure of this process in KiB ("VmRSS:", "VmHWM:" for the peak; Linux).
long status_kib(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(key.size()));
  return -1;
}

}  // namespace

TEST_CASE("tcp_store_server: a client killed with SIGKILL mid-wait does not stop the server") {
  // Fork before any actor system exists in this process: the child starts its own.
  int to_child[2];
  REQUIRE(::pipe(to_child) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(to_child[1]);
    std::uint16_t port = 0;
    if (::read(to_child[0], &port, sizeof(port)) != sizeof(port)) ::_exit(2);
    try {
      troupe::tcp_store mine("127.0.0.1", port, client_options());
      mine.set("child_alive", "1");
      mine.get("never_set");  // blocks here until killed
    } catch (...) {
    }
    ::_exit(1);  // never return into doctest
  }
  ::close(to_child[0]);
  troupe::tcp_store_server server("127.0.0.1", 0, token);
  const std::uint16_t port = server.port();
  REQUIRE(::write(to_child[1], &port, sizeof(port)) == sizeof(port));
  ::close(to_child[1]);

  troupe::tcp_store parent("127.0.0.1", port, client_options());
  CHECK(parent.get_string("child_alive") == "1");
  std::this_thread::sleep_for(100ms);  // the child is inside its blocking get now
  REQUIRE(::kill(pid, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status));
  std::this_thread::sleep_for(50ms);  // the server notices the closed connection

  parent.set("never_set", "now");  // the dead child's waiter must not be answered into a crash
  CHECK(parent.get_string("never_set") == "now");
  check_serving(port, "after_kill");
  CHECK(server.refused_requests() == 0);
}

TEST_CASE("tcp_store_server: garbage and truncated BASP headers leave the server working") {
  troupe::tcp_store_server server("127.0.0.1", 0, token);
  const auto port = server.port();
  troupe::tcp_store before("127.0.0.1", port, client_options());
  before.set("k", "v");

  SUBCASE("4 KiB of random bytes, several times") {
    std::mt19937 gen(12345);
    for (int round = 0; round < 8; ++round) {
      std::vector<std::uint8_t> junk(4096);
      for (auto& b : junk) b = static_cast<std::uint8_t>(gen());
      send_raw(port, junk, 20ms);
    }
  }
  SUBCASE("a truncated header, then a header with a truncated payload") {
    auto h = basp_header(0x01, 64, 1);  // client handshake
    send_raw(port, std::vector<std::uint8_t>(h.begin(), h.begin() + 13), 20ms);
    auto partial = h;
    partial.insert(partial.end(), 10, 0xab);  // 10 of the announced 64 payload bytes
    send_raw(port, partial, 20ms);
  }
  SUBCASE("a handshake header announcing a 64 MiB payload that never comes") {
    send_raw(port, basp_header(0x01, 64u << 20, 1), 100ms);
  }
  SUBCASE("headers of every operation with garbage payloads") {
    std::mt19937 gen(777);
    for (std::uint8_t op = 0; op < 8; ++op) {
      auto msg = basp_header(op, 48, gen());
      for (int i = 0; i < 48; ++i) msg.push_back(static_cast<std::uint8_t>(gen()));
      send_raw(port, msg, 20ms);
    }
  }
  CHECK(before.get_string("k") == "v");  // an existing client is unaffected
  check_serving(port, "after_garbage");
  CHECK(server.refused_requests() == 0);
}

// Known CAF 0.17.6 weakness, measured here (skipped by default; run it with
// --no-skip): BASP reads a 32-byte header and then allocates and zeroes a
// receive buffer of the announced payload_len before any handshake or token
// check. One unauthenticated connection that sends a client-handshake header
// announcing 0xfffffff0 bytes makes the server process allocate ~4 GiB
// (RSS 10 MB -> 4.2 GB) and stall its multiplexer (middleman.workers=0) for
// ~4.6 s; the memory stays until that connection closes. Four such connections
// took 16.8 GB and stalled the server for ~37 s. The server survives and then
// serves normally; the token only protects the store's data, not the
// server's memory, so keep the store on loopback or a trusted network.
TEST_CASE("tcp_store_server: a header announcing ~4 GiB (CAF 0.17 allocates it)" *
          doctest::skip()) {
  troupe::tcp_store_server server("127.0.0.1", 0, token);
  const long before = status_kib("VmRSS:");
  auto start = std::chrono::steady_clock::now();
  send_raw(server.port(), basp_header(0x01, 0xfffffff0u, 1), 200ms);
  check_serving(server.port(), "after_4gib");
  MESSAGE("RSS before " << before << " KiB, peak " << status_kib("VmHWM:")
                        << " KiB; served again after "
                        << std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::steady_clock::now() - start)
                               .count()
                        << " ms");
}
