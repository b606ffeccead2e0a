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

/// The store actor lives in this process: the store talks to it directly.
struct local_fixture {
  std::shared_ptr<troupe::store> s = [] {
    auto o = client_options();
    o.is_server = true;
    return std::make_shared<troupe::tcp_store>("127.0.0.1", 0, o);
  }();
};

/// A client reaching a tcp_store_server through the middleman (BASP over TCP).
struct remote_fixture {
  troupe::tcp_store_server server{"127.0.0.1", 0, token};
  std::shared_ptr<troupe::store> s =
      std::make_shared<troupe::tcp_store>("127.0.0.1", server.port(), client_options());
};

#define TCP_STORES local_fixture, remote_fixture

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

TEST_CASE_TEMPLATE("tcp_store: set, get, overwrite, binary and empty values", F, TCP_STORES) {
  F f;
  auto& s = *f.s;
  const bytes binary{0, 1, 0xff, '/', 0};
  s.set("bin", binary);
  CHECK(s.get("bin") == binary);
  s.set("k", "v1");
  CHECK(s.get_string("k") == "v1");
  s.set("k", "second value");
  CHECK(s.get_string("k") == "second value");
  s.set("empty", bytes{});
  CHECK(s.get("empty").empty());
  CHECK(s.check({"empty"}));
  bytes big(3 << 20);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::uint8_t>(i * 7);
  s.set("big", big);
  CHECK(s.get("big") == big);
}

TEST_CASE_TEMPLATE("tcp_store: add", F, TCP_STORES) {
  F f;
  auto& s = *f.s;
  CHECK(s.add("n", 5) == 5);
  CHECK(s.add("n", 3) == 8);
  CHECK(s.add("n", -10) == -2);
  CHECK(s.get_string("n") == "-2");
  s.set("word", "abc");
  check_error([&] { s.add("word", 1); }, errc::invalid_argument, {"tcp_store.add", "word'", "abc"});
  CHECK(s.get_string("word") == "abc");
  s.set("max", std::to_string(INT64_MAX));
  check_error([&] { s.add("max", 1); }, errc::invalid_argument, {"overflows", "max"});
}

TEST_CASE_TEMPLATE("tcp_store: compare_set", F, TCP_STORES) {
  F f;
  auto& s = *f.s;
  CHECK(s.compare_set("a", {}, to_bytes("x")) == to_bytes("x"));
  CHECK(s.compare_set("b", to_bytes("exp"), to_bytes("y")) == to_bytes("exp"));
  CHECK_FALSE(s.check({"b"}));
  CHECK(s.compare_set("a", to_bytes("x"), to_bytes("z")) == to_bytes("z"));
  CHECK(s.compare_set("a", to_bytes("nope"), to_bytes("w")) == to_bytes("z"));
  CHECK(s.compare_set("a", {}, to_bytes("w")) == to_bytes("z"));
  CHECK(s.get_string("a") == "z");
}

TEST_CASE_TEMPLATE("tcp_store: check and wait, with timeouts naming the missing keys", F,
                   TCP_STORES) {
  F f;
  auto& s = *f.s;
  CHECK(s.check({}));
  CHECK_FALSE(s.check({"present_key"}));
  s.set("present_key", "1");
  CHECK(s.check({"present_key"}));
  CHECK_FALSE(s.check({"present_key", "absent_key"}));
  s.wait({"present_key"});
  s.wait({"present_key"}, 50ms);
  s.wait({});
  auto start = std::chrono::steady_clock::now();
  check_error(
      [&] {
        s.wait({"present_key", "absent_key"}, 50ms);
      },
      errc::timeout, {"tcp_store.wait", "Timeout", "50 ms", "absent_key"});
  CHECK(std::chrono::steady_clock::now() - start >= 50ms);
  try {
    s.wait({"present_key", "absent_key"}, 0ms);
    FAIL("expected a timeout");
  } catch (const troupe::error& e) {
    CHECK(std::string(e.what()).find("present_key") == std::string::npos);  // only the missing
  }
  check_error([&] { s.wait({"gone1", "gone2"}, 50ms); }, errc::timeout, {"gone1", "gone2"});
}

TEST_CASE_TEMPLATE("tcp_store: get and multi_get time out", F, TCP_STORES) {
  F f;
  auto& s = *f.s;
  s.set_timeout(50ms);
  auto start = std::chrono::steady_clock::now();
  check_error([&] { s.get("never_set"); }, errc::timeout,
              {"tcp_store.get", "Timeout", "50 ms", "never_set"});
  CHECK(std::chrono::steady_clock::now() - start >= 50ms);
  CHECK(std::chrono::steady_clock::now() - start < 2s);
  s.set("m1", "1");
  check_error(
      [&] {
        s.multi_get({"m1", "missing_a", "missing_b"});
      },
      errc::timeout, {"tcp_store.multi_get", "Timeout", "50 ms", "missing_a", "missing_b"});
  s.set("late", "x");  // the expired waiters are gone: a later write finds none
  CHECK(s.get_string("late") == "x");
}

TEST_CASE_TEMPLATE("tcp_store: delete_key, num_keys, append, multi_get, multi_set", F, TCP_STORES) {
  F f;
  auto& s = *f.s;
  CHECK(s.num_keys() == 0);
  CHECK_FALSE(s.delete_key("k"));
  s.set("k", "v");
  s.add("counter", 1);
  CHECK(s.num_keys() == 2);
  CHECK(s.delete_key("k"));
  CHECK_FALSE(s.check({"k"}));
  CHECK(s.num_keys() == 1);
  s.append("log", to_bytes("ab"));
  s.append("log", to_bytes("cd"));
  s.append("log", {});
  CHECK(s.get_string("log") == "abcd");
  s.multi_set({"m1", "m2", "m3"}, {to_bytes("one"), to_bytes("two"), to_bytes("three")});
  auto values = s.multi_get({"m3", "m1", "m2"});
  REQUIRE(values.size() == 3);
  CHECK(troupe::to_string(values[0]) == "three");
  CHECK(troupe::to_string(values[2]) == "two");
  CHECK(s.multi_get({}).empty());
  s.multi_set({}, {});
  check_error(
      [&] {
        s.multi_set({"x", "y"}, {to_bytes("1"), to_bytes("2"), to_bytes("3")});
      },
      errc::invalid_argument, {"tcp_store.multi_set", "2 keys", "3 values"});
  CHECK_FALSE(s.check({"x"}));
}

TEST_CASE_TEMPLATE("tcp_store: blocking calls are released by writes; concurrent adds", F,
                   TCP_STORES) {
  F f;
  auto& s = *f.s;
  std::thread setter([&] {
    std::this_thread::sleep_for(30ms);
    s.set("late", "arrived");
    std::this_thread::sleep_for(30ms);
    s.add("later", 1);
    s.append("latest", to_bytes("a"));
  });
  CHECK(s.get_string("late") == "arrived");
  s.wait({"late", "later"});
  CHECK(s.multi_get({"latest", "later"})[1] == to_bytes("1"));
  setter.join();

  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) s.add("c", 1);
    });
  for (auto& t : threads) t.join();
  CHECK(s.add("c", 0) == 400);
}

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
