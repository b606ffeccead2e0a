// Tests that a tcp_store_server survives misbehaving peers: a client process
// killed with SIGKILL while it waits, and raw sockets that send garbage,
// truncated BASP headers or hostile gate preambles (store/store_gate.hpp) —
// including the BASP header announcing ~4 GiB that CAF 0.17 would allocate
// before any authentication. After each, proper clients keep working.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loopback.hpp"
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

/// Connects a raw socket, writes `data`, ends its sending side and returns what the server
/// answers until it closes the connection (or `wait` passes).
std::string exchange_raw(std::uint16_t port, const std::vector<std::uint8_t>& data,
                         std::chrono::milliseconds wait = 8s) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  for (std::size_t off = 0; off < data.size();) {
    auto n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;  // the gate closes on the first bad byte
    off += static_cast<std::size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  timeval tv{static_cast<time_t>(wait.count() / 1000), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string answer;
  char buf[256];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) answer.append(buf, buf + n);
  ::close(fd);
  return answer;
}

/// A gate preamble: the magic, a big-endian token length and the token bytes.
std::vector<std::uint8_t> preamble(std::uint32_t announced, const std::string& tok) {
  std::vector<std::uint8_t> p = {'T', 'R', 'O', 'U', 'P', 'E', 'S', '2'};
  for (int shift : {24, 16, 8, 0}) p.push_back(static_cast<std::uint8_t>(announced >> shift));
  p.insert(p.end(), tok.begin(), tok.end());
  return p;
}

/// Waits (up to 10 s) until the server has refused `n` connections; answers how many it has.
std::uint64_t wait_refused(const troupe::tcp_store_server& server, std::uint64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (server.refused_connections() < n && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  return server.refused_connections();
}

/// This process's resident set in KiB (/proc/self/statm).
long rss_kib() {
  std::ifstream in("/proc/self/statm");
  long size = 0, resident = -1;
  in >> size >> resident;
  return resident < 0 ? -1 : resident * (::sysconf(_SC_PAGESIZE) / 1024);
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

TEST_CASE("tcp_store: a store whose process died is named by that process in every failure") {
  // The server tells each client who it is when it admits it (troupe-run,
  // troupe-store, rank 0): a client that loses it says which process died.
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof(host) - 1) == 0);
  for (const std::string who : {"troupe-store", "rank 0"}) {
    CAPTURE(who);
    int from_child[2];
    REQUIRE(::pipe(from_child) == 0);
    const pid_t pid = ::fork();  // before this process starts any thread of this case
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(from_child[0]);
      try {
        // A standalone server (troupe-store's), or rank 0's (is_server, as make_store names it).
        std::unique_ptr<troupe::tcp_store_server> server;
        std::unique_ptr<troupe::tcp_store> rank0;
        std::uint16_t port = 0;
        if (who == "troupe-store") {
          server = std::make_unique<troupe::tcp_store_server>("127.0.0.1", 0, token, who);
          port = server->port();
        } else {
          auto o = client_options();
          o.is_server = true;
          o.server_name = who;
          rank0 = std::make_unique<troupe::tcp_store>("127.0.0.1", 0, o);
          port = rank0->port();
        }
        if (::write(from_child[1], &port, sizeof(port)) == sizeof(port))
          std::this_thread::sleep_for(60s);  // killed long before
      } catch (...) {
      }
      ::_exit(1);  // never return into doctest
    }
    ::close(from_child[1]);
    std::uint16_t port = 0;
    REQUIRE(::read(from_child[0], &port, sizeof(port)) == sizeof(port));
    ::close(from_child[0]);
    const std::string served_by =
        who + " (pid " + std::to_string(pid) + ") on host " + std::string(host);
    {
      troupe::tcp_store client("127.0.0.1", port, client_options());
      client.set("k", "v");
      CHECK(client.served_by() == served_by);
      REQUIRE(::kill(pid, SIGKILL) == 0);
      REQUIRE(::waitpid(pid, nullptr, 0) == pid);
      std::string what = "no error";
      try {
        client.get("k");
      } catch (const troupe::error& e) {
        CHECK(e.code() == troupe::errc::store);
        what = e.what();
      }
      INFO(what);
      CHECK(what.find("lost the store at 127.0.0.1:" + std::to_string(port) + " served by " +
                      served_by + ": ") != std::string::npos);
    }
  }
}

TEST_CASE("tcp_store: a connection dropped before the store answered is tried again") {
  // A store flooded by strangers may drop a pending connection to make room
  // (transport/pending_handshakes.hpp): its client tries again within its
  // timeout. Here the first store on the port drops every connection unread
  // for a while, then the real one takes the port over.
  const auto [listener, port] = troupe::test::loopback_listener(16);
  std::atomic<int> dropped{0};
  std::thread dropper([&] {
    timeval tv{0, 100000};
    ::setsockopt(listener, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    for (auto until = std::chrono::steady_clock::now() + 300ms;
         std::chrono::steady_clock::now() < until;)
      if (const int fd = ::accept(listener, nullptr, nullptr); fd >= 0) {
        ::close(fd);
        ++dropped;
      }
    ::close(listener);
  });
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<troupe::tcp_store_server> server;
  std::thread later([&] {
    dropper.join();
    server = std::make_unique<troupe::tcp_store_server>("127.0.0.1", port, token, "troupe-store");
  });
  std::string what = "connected";
  try {
    troupe::tcp_store client("127.0.0.1", port, client_options());
    later.join();
    client.set("k", "v");
    CHECK(client.get_string("k") == "v");
  } catch (const std::exception& e) {
    what = e.what();
    later.join();
  }
  const auto took = std::chrono::steady_clock::now() - start;
  INFO(what);
  CHECK(what == "connected");
  CHECK(dropped >= 1);
  MESSAGE("dropped " << dropped.load() << " time(s), connected after "
                     << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                     << " ms");
  CHECK(took < 5s);
}

TEST_CASE("tcp_store_server: garbage and truncated BASP headers leave the server working") {
  troupe::tcp_store_server server("127.0.0.1", 0, token);
  const auto port = server.port();
  troupe::tcp_store before("127.0.0.1", port, client_options());
  before.set("k", "v");
  std::uint64_t sent = 0;  // each is refused by the gate: none is a troupe preamble

  SUBCASE("4 KiB of random bytes, several times") {
    std::mt19937 gen(12345);
    for (int round = 0; round < 8; ++round) {
      std::vector<std::uint8_t> junk(4096);
      for (auto& b : junk) b = static_cast<std::uint8_t>(gen());
      send_raw(port, junk, 20ms);
      ++sent;
    }
  }
  SUBCASE("a truncated header, then a header with a truncated payload") {
    auto h = basp_header(0x01, 64, 1);  // client handshake
    send_raw(port, std::vector<std::uint8_t>(h.begin(), h.begin() + 13), 20ms);
    auto partial = h;
    partial.insert(partial.end(), 10, 0xab);  // 10 of the announced 64 payload bytes
    send_raw(port, partial, 20ms);
    sent += 2;
  }
  SUBCASE("a handshake header announcing a 64 MiB payload that never comes") {
    send_raw(port, basp_header(0x01, 64u << 20, 1), 100ms);
    ++sent;
  }
  SUBCASE("headers of every operation with garbage payloads") {
    std::mt19937 gen(777);
    for (std::uint8_t op = 0; op < 8; ++op) {
      auto msg = basp_header(op, 48, gen());
      for (int i = 0; i < 48; ++i) msg.push_back(static_cast<std::uint8_t>(gen()));
      send_raw(port, msg, 20ms);
      ++sent;
    }
  }
  CHECK(before.get_string("k") == "v");  // an existing client is unaffected
  check_serving(port, "after_garbage");
  CHECK(wait_refused(server, sent) == sent);
  CHECK(server.refused_requests() == 0);
}

// CAF 0.17.6's BASP reads a 32-byte header and then allocates and zeroes a
// receive buffer of the announced payload_len before any handshake or token
// check. Without the gate, one connection sending a client-handshake header that
// announces 0xfffffff0 bytes made this process allocate ~4 GiB (RSS 9 MB ->
// 4.2 GB) and stalled the server for ~9 s; four took 16.8 GB. Now the gate reads
// at most 8 + 4 + 4096 bytes of a stranger, into a fixed buffer, and never
// passes a byte of theirs to CAF.
TEST_CASE(
    "tcp_store_server: the gate refuses hostile peers without allocating what they announce") {
  troupe::tcp_store_server server("127.0.0.1", 0, token);
  const auto port = server.port();
  check_serving(port, "warm_up");  // the clients' first-use allocations happen before measuring
  const long rss_before = rss_kib(), peak_before = status_kib("VmHWM:");
  const auto start = std::chrono::steady_clock::now();

  // Only the magic, then silence: closed after the gate's 2 s handshake deadline.
  std::string slow_answer = "unset";
  std::thread slow([&] {
    auto magic = preamble(0, "");
    magic.resize(8);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return;
    ::send(fd, magic.data(), magic.size(), MSG_NOSIGNAL);
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char c;
    const auto n = ::recv(fd, &c, 1, 0);
    slow_answer = n == 0 ? "" : n > 0 ? std::string(1, c) : "still open";
    ::close(fd);
  });
  // The attack CAF fell for, four times at once: each is refused, nothing is allocated.
  std::vector<std::thread> attackers;
  std::vector<std::string> answers(4, "unset");
  for (auto& a : answers)
    attackers.emplace_back([&] { a = exchange_raw(port, basp_header(0x01, 0xfffffff0u, 1)); });
  for (auto& t : attackers) t.join();
  for (const auto& a : answers) CHECK(a.empty());  // closed without an answer
  std::uint64_t sent = 4;

  std::mt19937 gen(4242);
  std::vector<std::uint8_t> junk(4096);
  for (auto& b : junk) b = static_cast<std::uint8_t>(gen());
  auto truncated_magic = preamble(5, "abcde");
  truncated_magic.resize(5);
  auto truncated_length = preamble(5, "abcde");
  truncated_length.resize(10);
  const std::vector<std::vector<std::uint8_t>> hostile = {
      junk,                                           // random bytes
      truncated_magic,                                // closes inside the magic
      truncated_length,                               // closes inside the token length
      preamble(100, "short"),                         // closes inside the token
      preamble(0xffffffffu, "x"),                     // right magic, a 4 GiB token length
      preamble(0xfffffff0u, std::string(4096, 't')),  // the same, with bytes following
      preamble(4097, std::string(4097, 't')),         // one byte over the limit
      preamble(0, ""),                                // an empty token
  };
  for (const auto& h : hostile) CHECK(exchange_raw(port, h).empty());
  sent += hostile.size();
  auto wrong = token;
  wrong.back() ^= 1;
  CHECK(exchange_raw(port, preamble(static_cast<std::uint32_t>(wrong.size()), wrong)) ==
        std::string(1, '\0'));  // a well-formed preamble with the wrong token: answered 0
  ++sent;
  const auto prefix = token.substr(0, token.size() - 1);
  CHECK(exchange_raw(port, preamble(static_cast<std::uint32_t>(prefix.size()), prefix)) ==
        std::string(1, '\0'));  // a prefix of the right token
  ++sent;
  const auto attacked = std::chrono::steady_clock::now() - start;
  check_serving(port, "after_attacks");
  CHECK(wait_refused(server, sent) == sent);

  slow.join();
  CHECK(slow_answer.empty());                                 // the gate closed it
  CHECK(std::chrono::steady_clock::now() - start >= 1500ms);  // the gate's 2 s handshake deadline
  CHECK(wait_refused(server, sent + 1) == sent + 1);
  CHECK(server.refused_requests() == 0);

  const long rss_after = rss_kib(), peak_after = status_kib("VmHWM:");
  MESSAGE("RSS before " << rss_before << " KiB, after " << rss_after << " KiB; peak before "
                        << peak_before << " KiB, after " << peak_after << " KiB; attacks took "
                        << std::chrono::duration_cast<std::chrono::milliseconds>(attacked).count()
                        << " ms");
  CHECK(rss_after - rss_before < 64 * 1024);
  CHECK(peak_after - peak_before < 64 * 1024);
  CHECK(attacked < 3s);
}
