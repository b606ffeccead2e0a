// Tests for tcp_store: the store suite on a server in this process (is_server)
// and on a client reaching a tcp_store_server over TCP; two clients; tokens;
// unreachable and unbindable addresses. Dying clients and garbage bytes are in
// test_tcp_store_faults.cpp.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "check_error.hpp"
#include "troupe/error.hpp"
#include "troupe/tcp_store.hpp"

using namespace std::chrono_literals;
using troupe::bytes;
using troupe::errc;
using troupe::to_bytes;
using troupe::test::check_error;

namespace {

constexpr auto long_timeout = troupe::store::duration(10s);
const std::string token = "job-secret-1";

troupe::tcp_store_options client_options(std::string tok = token) {
  troupe::tcp_store_options o;
  o.token = std::move(tok);
  o.timeout = long_timeout;
  return o;
}

/// Runs `f` with stderr redirected to a file; returns what was written.
template <class F>
std::string captured_stderr(F&& f) {
  char name[] = "/tmp/troupe_test_tcp_store_XXXXXX";
  int fd = ::mkstemp(name);
  REQUIRE(fd >= 0);
  std::fflush(stderr);
  int saved = ::dup(2);
  ::dup2(fd, 2);
  f();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  std::ifstream in(name);
  std::stringstream text;
  text << in.rdbuf();
  ::unlink(name);
  return text.str();
}

}  // namespace

// The store interface itself (every method, timeouts, blocking calls,
// concurrent adds) is checked for tcp_store by the fixture-parameterized cases
// of test_store.cpp; the cases here cover what only a TCP store has.

TEST_CASE("tcp_store: port 0 reports the real port; two clients share one server") {
  auto o = client_options();
  o.is_server = true;
  troupe::tcp_store host("127.0.0.1", 0, o);
  REQUIRE(host.port() != 0);
  troupe::tcp_store a("127.0.0.1", host.port(), client_options());
  troupe::tcp_store b("127.0.0.1", host.port(), client_options());
  CHECK(a.port() == host.port());
  host.set("from_host", "h");
  CHECK(a.get_string("from_host") == "h");
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    b.set("from_b", "released");
  });
  auto start = std::chrono::steady_clock::now();
  CHECK(a.get_string("from_b") == "released");  // a blocks until b's set
  CHECK(std::chrono::steady_clock::now() - start >= 40ms);
  setter.join();
  CHECK(host.num_keys() == 2);
}

TEST_CASE("tcp_store: threads sharing one client get their answers without delay") {
  // Two ranks of one process share the job's store client: their requests
  // and the server's answers interleave on one connection. An answer queued
  // behind another one that is not yet acknowledged must leave at once (no
  // Nagle delay on the server's side): a round here took 40 ms before.
  troupe::tcp_store_server server("127.0.0.1", 0, token);
  troupe::tcp_store shared("127.0.0.1", server.port(), client_options());
  constexpr int rounds = 60;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i) {
    const auto key = "round/" + std::to_string(i);
    std::thread other([&] { shared.add(key + "/count", 1); });
    shared.set(key, "x");
    shared.wait({key + "/count"});
    other.join();
  }
  const auto took = std::chrono::steady_clock::now() - start;
  MESSAGE(rounds << " rounds of two threads' requests took "
                 << std::chrono::duration<double>(took).count() << " s");
  CHECK(took < 1200ms);  // 20 ms a round: half of one delayed acknowledgement
}

TEST_CASE(
    "tcp_store: a wrong token is refused at connect, counted and logged; the right one works") {
  troupe::tcp_store_server server("127.0.0.1", 0, token);
  const auto where = "127.0.0.1:" + std::to_string(server.port());
  troupe::tcp_store good("127.0.0.1", server.port(), client_options());
  good.set("k", "v");
  CHECK(server.refused_connections() == 0);
  auto log = captured_stderr([&] {
    for (int i = 0; i < 2; ++i) {
      const auto start = std::chrono::steady_clock::now();
      check_error([&] { troupe::tcp_store("127.0.0.1", server.port(), client_options("not-it")); },
                  errc::store, {where, "refused this process's job token", "TROUPE_JOB_TOKEN"});
      CHECK(std::chrono::steady_clock::now() - start < 2s);  // at once, not after the timeout
    }
  });
  CHECK(log.find("[troupe store] refused connection from 127.0.0.1:") != std::string::npos);
  CHECK(log.find(": wrong job token") != std::string::npos);
  CHECK(server.refused_connections() == 2);
  CHECK(server.refused_requests() == 0);  // nothing of theirs reached the store actor
  CHECK(good.get_string("k") == "v");
  good.set("k", "v2");
  CHECK(good.get_string("k") == "v2");
  CHECK(server.refused_connections() == 2);
}

TEST_CASE("tcp_store: empty tokens are rejected before anything starts") {
  check_error([] { troupe::tcp_store_server("127.0.0.1", 0, ""); }, errc::invalid_argument,
              {"tcp_store_server", "TROUPE_JOB_TOKEN"});
  check_error([] { troupe::tcp_store("127.0.0.1", 1, client_options("")); }, errc::invalid_argument,
              {"tcp_store", "127.0.0.1:1", "TROUPE_JOB_TOKEN"});
}

TEST_CASE("tcp_store: an unreachable store and an unusable address") {
  std::uint16_t closed_port = 0;
  {
    troupe::tcp_store_server gone("127.0.0.1", 0, token);
    closed_port = gone.port();
  }
  auto o = client_options();
  o.timeout = 300ms;
  auto start = std::chrono::steady_clock::now();
  check_error([&] { troupe::tcp_store("127.0.0.1", closed_port, o); }, errc::store,
              {"cannot reach store at 127.0.0.1:" + std::to_string(closed_port), "300 ms"});
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 300ms);
  CHECK(took < 3s);

  troupe::tcp_store_server taken("127.0.0.1", 0, token);
  const auto port = std::to_string(taken.port());
  check_error([&] { troupe::tcp_store_server("127.0.0.1", taken.port(), token); }, errc::store,
              {"tcp_store_server", "cannot listen on 127.0.0.1:" + port});
  check_error([] { troupe::tcp_store_server("256.0.0.1", 0, token); }, errc::store,
              {"256.0.0.1:0"});
}

TEST_CASE("tcp_store: clients waiting on a server that shuts down fail promptly") {
  auto server = std::make_unique<troupe::tcp_store_server>("127.0.0.1", 0, token);
  troupe::tcp_store client("127.0.0.1", server->port(), client_options());
  std::string what;
  errc code = errc::internal;
  std::thread waiter([&] {
    try {
      client.get("never");
    } catch (const troupe::error& e) {
      code = e.code();
      what = e.what();
    }
  });
  std::this_thread::sleep_for(100ms);
  auto start = std::chrono::steady_clock::now();
  server.reset();
  waiter.join();
  CAPTURE(what);
  CHECK(code == errc::store);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  check_error([&] { client.set("k", "v"); }, errc::store, {"tcp_store.set", "127.0.0.1:"});
}
