// Strangers against the two doors of a rank: its data plane's port and rank
// 0's store. A flood of short connections and a slowloris (many connections
// sending their handshake a byte at a time) cost bounded threads and memory
// (measured in this process before, during and after), every slow stranger
// is closed by the 2 s handshake deadline, no more than the cap of pending
// handshakes await authentication at once (the oldest are dropped for
// newcomers), and the rank keeps working. The store's process listens on its
// store port only (no CAF endpoint behind it), and a client that proved the
// token but sends malformed or oversized requests is dropped without the
// server holding more than what it sent. The doors' rules by hand: a
// newcomer pushes out the busiest source's oldest pending connection
// (silent ones first), never another source's nor a real client, and the
// deadlines for the first bytes and the whole handshake.

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "../actors/rank_runtime.hpp"
#include "../transport/data_plane.hpp"
#include "../transport/pending_handshakes.hpp"
#include "forked_ranks.hpp"
#include "loopback.hpp"
#include "troupe/tcp_store.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

int connect_to(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// What a slowloris saw: when each connection was closed by the server.
struct slowloris_result {
  int opened = 0;
  int closed_early = 0;  // within 1.5 s: dropped for newer ones (too many pending)
  int closed_by_deadline = 0;
  int still_open = 0;  // after `hold`
  double slowest_close_s = 0;
};

/// Opens `n` connections to `port` that send `handshake` one byte every
/// 200 ms, for at most `hold`; `during` runs once, 1 s in.
slowloris_result slowloris(std::uint16_t port, int n, const std::string& handshake,
                           std::chrono::seconds hold, const std::function<void()>& during) {
  slowloris_result out;
  struct conn {
    int fd;
    std::size_t sent = 0;
    bool open = true;
  };
  std::vector<conn> conns;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i)
    if (int fd = connect_to(port); fd >= 0) {
      ::fcntl(fd, F_SETFL, O_NONBLOCK);
      conns.push_back({fd});
    }
  out.opened = static_cast<int>(conns.size());
  bool ran = false;
  while (std::chrono::steady_clock::now() - start < hold) {
    int open = 0;
    for (auto& c : conns) {
      if (!c.open) continue;
      char buf[16];
      const auto r = ::recv(c.fd, buf, sizeof(buf), 0);
      const bool ended =
          r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ||
          ::send(c.fd, handshake.data() + c.sent % handshake.size(), 1, MSG_NOSIGNAL) < 0;
      if (!ended) {
        ++c.sent;
        ++open;
        continue;
      }
      c.open = false;
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      (s < 1.5 ? out.closed_early : out.closed_by_deadline)++;
      out.slowest_close_s = std::max(out.slowest_close_s, s);
    }
    if (open == 0) break;
    if (!ran && std::chrono::steady_clock::now() - start >= 1s) {
      during();
      ran = true;
    }
    std::this_thread::sleep_for(200ms);
  }
  for (auto& c : conns) {
    out.still_open += c.open;
    ::close(c.fd);
  }
  return out;
}

/// How many connections a flood opens (TROUPE_FLOOD_CONNECTIONS, 5000 by default).
int flood_size() {
  const char* env = std::getenv("TROUPE_FLOOD_CONNECTIONS");
  return env ? std::max(1, std::atoi(env)) : 5000;
}

/// `n` connections opened and closed as fast as 4 threads can (half send junk first).
void flood(std::uint16_t port, int n) {
  std::vector<std::thread> threads;
  std::atomic<int> left{n};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      while (left.fetch_sub(1) > 0) {
        const int fd = connect_to(port);
        if (fd < 0) continue;
        if (left.load() % 2) ::send(fd, "GET / HTTP/1.0\r\n\r\n", 18, MSG_NOSIGNAL);
        linger reset{1, 0};  // closed with a reset: no TIME_WAIT, ports are not used up
        ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
        ::close(fd);
      }
    });
  for (auto& t : threads) t.join();
}

/// Listening TCP sockets this process holds.
int listening_sockets() {
  std::set<std::string> mine;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto link = std::filesystem::read_symlink(e.path(), ec).string();
    if (link.rfind("socket:[", 0) == 0) mine.insert(link.substr(8, link.size() - 9));
  }
  std::ifstream in("/proc/self/net/tcp");
  std::string line;
  std::getline(in, line);
  int n = 0;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, state, queues, tr, retr, uid, timeout, inode;
    f >> sl >> local >> remote >> state >> queues >> tr >> retr >> uid >> timeout >> inode;
    n += state == "0A" && mine.count(inode);
  }
  return n;
}

/// Threads and RSS (KiB) of this process.
struct usage {
  long threads = test::status_value("Threads:");
  long rss = test::status_value("VmRSS:");
};

void report(const char* what, const usage& before, const usage& during, const usage& after,
            const slowloris_result& s) {
  MESSAGE(std::string(what) << ": threads " << before.threads << " before, " << during.threads
                            << " during the slowloris, " << after.threads
                            << " after the flood; RSS " << before.rss / 1024 << " MiB before, "
                            << during.rss / 1024 << " during, " << after.rss / 1024
                            << " after; slowloris: " << s.opened << " opened, " << s.closed_early
                            << " dropped early, " << s.closed_by_deadline
                            << " closed by the deadline (last at " << s.slowest_close_s << " s), "
                            << s.still_open << " still open; flood: " << flood_size()
                            << " connections");
}

void check_bounded(const usage& before, const usage& during, const usage& after,
                   const slowloris_result& s, int n) {
  CHECK(during.threads <= before.threads + 2);  // no thread per stranger
  CHECK(after.threads <= before.threads + 2);
  CHECK(during.rss - before.rss < 64 * 1024);  // KiB: generous
  CHECK(after.rss - before.rss < 64 * 1024);
  // At most this many await authentication at once; newcomers push out the oldest.
  const int cap = static_cast<int>(detail::pending_handshakes::default_limits().max_pending);
  CHECK(s.opened == n);
  CHECK(s.still_open == 0);  // nobody outlives the handshake deadline
  CHECK(s.closed_by_deadline <= cap);
  CHECK(s.closed_early >= n - cap);
  CHECK(s.slowest_close_s < 6);  // the 2 s deadline, with a generous margin
}

}  // namespace

TEST_CASE("a data-plane port: a slowloris and a flood cost bounded threads and memory") {
  // Rank 1 lives in a child; this process is rank 0 and the target.
  const auto path = test::temp_store_path();
  const pid_t child = ::fork();
  if (child == 0) {
    ::setenv("TROUPE_TRANSPORT", "tcp", 1);
    bool ok = false;
    try {
      auto s = std::make_shared<file_store>(path, 60s);
      world w{test::child_world(s, 1, 2, 60s)};
      s->wait({"attacks_done"}, 60s);
      auto t = tensor::from_vector<int>({1});
      w.default_group().allreduce(t).wait();
      ok = t.to_vector<int>()[0] == 3;
      w.default_group().barrier().wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank 1: %s\n", e.what());
    }
    ::_exit(ok ? 0 : 1);
  }
  ::setenv("TROUPE_TRANSPORT", "tcp", 1);
  auto s = std::make_shared<file_store>(path, 60s);
  {
    world w{test::child_world(s, 0, 2, 60s)};
    ::unsetenv("TROUPE_TRANSPORT");
    auto& plane = *w.runtime().plane();
    const auto port = plane.port();
    REQUIRE(port != 0);
    const auto refused_before = plane.refused();
    const usage before;
    usage during;
    const int n = 300;  // more than the cap: the oldest are dropped
    // A hello announcing a 16-byte token, then the token, a byte at a time.
    const std::string hello = std::string("TROUPEH1\x10\0\0\0", 12) + "0123456789abcdef";
    const auto slow = slowloris(port, n, hello, 10s, [&] { during = usage{}; });
    flood(port, flood_size());
    std::this_thread::sleep_for(200ms);  // the last handshakes end
    const usage after;
    report("data plane", before, during, after, slow);
    check_bounded(before, during, after, slow, n);
    CHECK(plane.refused() - refused_before >= static_cast<std::uint64_t>(n));
    CHECK(plane.reader_threads() == 1);  // rank 1's connection only
    s->set("attacks_done", "1");
    auto t = tensor::from_vector<int>({2});
    w.default_group().allreduce(t).wait();  // it still works
    CHECK(t.to_vector<int>()[0] == 3);
    w.default_group().barrier().wait();
  }
  CHECK(test::wait_for_children({child})[0] == 0);
  ::unlink(path.c_str());
}

TEST_CASE("rank 0's store: one listening port; a slowloris and a flood cost bounded resources") {
  const int listening = listening_sockets();
  tcp_store_options o;
  o.is_server = true;
  o.token = "0123456789abcdef";
  o.timeout = 20s;
  tcp_store server("127.0.0.1", 0, o);  // as rank 0 hosts it
  // Its only door: no CAF port on loopback or elsewhere.
  CHECK(listening_sockets() == listening + 1);
  o.is_server = false;
  tcp_store client("127.0.0.1", server.port(), o);
  client.set("before", "1");
  const usage before;
  usage during;
  const int n = 300;  // more than the cap: the oldest are dropped
  const std::string preamble = std::string("TROUPES2\0\0\0\x10", 12) + "0123456789abcdef";
  const auto slow = slowloris(server.port(), n, preamble, 10s, [&] {
    during = usage{};
    CHECK(client.get_string("before") == "1");  // serving meanwhile
  });
  flood(server.port(), flood_size());
  std::this_thread::sleep_for(200ms);
  const usage after;
  report("store", before, during, after, slow);
  check_bounded(before, during, after, slow, n);
  client.set("after", "2");
  CHECK(server.get_string("after") == "2");
}

TEST_CASE("rank 0's store: a client with the token that sends malformed requests is dropped") {
  tcp_store_server server("127.0.0.1", 0, "0123456789abcdef");
  tcp_store_options o;
  o.token = "0123456789abcdef";
  o.timeout = 20s;
  tcp_store client("127.0.0.1", server.port(), o);
  client.set("k", "v");
  const usage before;
  // Each connection proves the token, then sends one bad message.
  auto after_preamble = [&](const std::string& bytes, time_t wait_s = 5) {
    const int fd = connect_to(server.port());
    REQUIRE(fd >= 0);
    const auto preamble = std::string("TROUPES2\0\0\0\x10", 12) + "0123456789abcdef";
    ::send(fd, preamble.data(), preamble.size(), MSG_NOSIGNAL);
    char ack = 0;
    CHECK(::recv(fd, &ack, 1, 0) == 1);
    CHECK(ack == 1);
    unsigned char len = 0;  // then who serves
    CHECK(::recv(fd, &len, 1, 0) == 1);
    std::string served_by(len, '\0');
    CHECK(::recv(fd, served_by.data(), len, MSG_WAITALL) == len);
    ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    timeval tv{wait_s, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char c;
    const auto n = ::recv(fd, &c, 1, 0);  // closed by the server: 0; still open: -1
    ::close(fd);
    return n;
  };
  auto le32 = [](std::uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); };
  CHECK(after_preamble(le32(0xffffffffu)) == 0);                        // over 1 GiB
  CHECK(after_preamble(le32(9) + std::string(8, '\0') + "\x7f") == 0);  // an unknown request
  // A set whose key announces more bytes than its message holds.
  CHECK(after_preamble(le32(13) + std::string(8, '\0') + '\0' + le32(1u << 30)) == 0);
  // 1 GiB announced, 64 KiB sent: the server holds what came, not what was announced.
  CHECK(after_preamble(le32(1u << 30) + std::string(64 << 10, 'x'), 1) == -1);
  const usage after;
  MESSAGE("store with malformed requests: RSS " << before.rss / 1024 << " -> " << after.rss / 1024
                                                << " MiB");
  CHECK(after.rss - before.rss < 64 * 1024);
  CHECK(client.get_string("k") == "v");  // the store and its other clients go on
}

namespace {

/// A connection to `port` on 127.0.0.1 from `source` (any 127.x.y.z), having sent `first`.
int connect_from(const char* source, std::uint16_t port, const std::string& first) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) == 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0);
  if (!first.empty()) REQUIRE(::send(fd, first.data(), first.size(), MSG_NOSIGNAL) > 0);
  return fd;
}

/// Whether the server closed `fd` (its end read as 0 or a reset), waiting up to `wait`.
bool closed_by_server(int fd, std::chrono::milliseconds wait = 200ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

}  // namespace

TEST_CASE("pending handshakes: a newcomer pushes out the busiest source's oldest, silent first") {
  // The door of the store and the data plane, driven by hand: 8 may be
  // pending; a stranger at 127.0.0.1 fills them, another source (127.0.0.2)
  // holds two with half a preamble, and a real client comes last.
  const auto [listener, port] = test::loopback_listener();
  std::vector<std::string> refused, admitted;
  detail::pending_handshakes::limits limits;
  limits.max_pending = 8;
  limits.first_bytes = 10s;  // no deadline interferes here
  limits.deadline = 10s;
  detail::pending_handshakes pending(
      [] { return std::make_unique<detail::preamble_decoder>(); },
      [&](int fd, const std::string& peer, detail::handshake_decoder&) {
        admitted.push_back(peer);
        ::close(fd);
      },
      [&](const std::string& peer, const std::string& why) {
        refused.push_back(peer + ": " + why);
      },
      limits);
  // Connects (from `source`, having sent `first`) and hands the accepted socket to `pending`.
  auto arrive = [&](const char* source, const std::string& first) {
    const int fd = connect_from(source, port, first);
    if (!first.empty()) std::this_thread::sleep_for(5ms);  // its bytes are there to read
    const int accepted = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    REQUIRE(accepted >= 0);
    pending.add(accepted);
    return fd;
  };
  const std::string half = "TROUPES2";
  std::vector<int> other = {arrive("127.0.0.2", half), arrive("127.0.0.2", half)};
  std::vector<int> silent, heard;
  for (int i = 0; i < 6; ++i) silent.push_back(arrive("127.0.0.1", ""));
  CHECK(pending.size() == 8);
  CHECK(refused.empty());
  // A newcomer: the busiest source's oldest silent connection makes room.
  heard.push_back(arrive("127.0.0.1", half));
  CHECK(pending.size() == 8);
  CHECK(pending.dropped() == 1);
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].find("dropped to make room for a newer connection (8 awaiting "
                        "authentication, 6 from 127.0.0.1)") != std::string::npos);
  CHECK(closed_by_server(silent[0]));
  for (std::size_t i = 1; i < silent.size(); ++i) CHECK_FALSE(closed_by_server(silent[i], 0ms));
  // Six more: the silent go first, then the oldest that sent something.
  for (int i = 0; i < 6; ++i) heard.push_back(arrive("127.0.0.1", half));
  CHECK(pending.dropped() == 7);
  for (int fd : silent) CHECK(closed_by_server(fd));
  CHECK(closed_by_server(heard[0]));
  for (std::size_t i = 1; i < heard.size(); ++i) CHECK_FALSE(closed_by_server(heard[i], 0ms));
  for (int fd : other) CHECK_FALSE(closed_by_server(fd, 0ms));  // the other source keeps its own
  // A real client while all 8 are taken: its preamble is read at once, nobody is dropped.
  const auto preamble = std::string("TROUPES2\0\0\0\x10", 12) + "0123456789abcdef";
  const int real = arrive("127.0.0.1", preamble);
  CHECK(admitted.size() == 1);
  CHECK(pending.dropped() == 7);
  CHECK(pending.size() == 8);
  for (int fd : other) CHECK_FALSE(closed_by_server(fd, 0ms));
  for (int fd : other) ::close(fd);
  for (int fd : silent) ::close(fd);
  for (int fd : heard) ::close(fd);
  ::close(real);
  ::close(listener);
}

TEST_CASE("pending handshakes: a silent connection has 500 ms, a handshake 2 s") {
  const auto [listener, port] = test::loopback_listener();
  std::vector<std::pair<double, std::string>> refused;
  const auto start = std::chrono::steady_clock::now();
  detail::pending_handshakes pending(
      [] { return std::make_unique<detail::preamble_decoder>(); },
      [](int fd, const std::string&, detail::handshake_decoder&) { ::close(fd); },
      [&](const std::string&, const std::string& why) {
        refused.emplace_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), why);
      });
  const int silent = connect_from("127.0.0.1", port, "");
  const int slow = connect_from("127.0.0.1", port, "TROUPES2");
  std::this_thread::sleep_for(5ms);
  for (int i = 0; i < 2; ++i) pending.add(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
  // The door's loop: poll the pending ones until their deadlines passed.
  while (pending.size() > 0 && std::chrono::steady_clock::now() - start < 10s) {
    std::vector<pollfd> fds;
    pending.poll_set(fds);
    ::poll(fds.data(), fds.size(), pending.timeout_ms());
    pending.advance(fds.data(), fds.size());
  }
  REQUIRE(refused.size() == 2);
  MESSAGE("refused after " << refused[0].first << " s: " << refused[0].second << "; after "
                           << refused[1].first << " s: " << refused[1].second);
  CHECK(refused[0].second == "sent nothing within 500 ms of being accepted");
  CHECK(refused[0].first >= 0.45);
  CHECK(refused[0].first < 1.5);
  CHECK(refused[1].second == "no complete handshake within 2000 ms");
  CHECK(refused[1].first >= 1.9);
  CHECK(refused[1].first < 4);
  CHECK(closed_by_server(silent));
  CHECK(closed_by_server(slow));
  ::close(silent);
  ::close(slow);
  ::close(listener);
}
