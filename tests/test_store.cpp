// Tests for the key-value stores: hash_store, file_store, prefix_store and
// store_based_barrier. The same checks run on every store through fixtures.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/store.hpp"
#include "troupe/tcp_store.hpp"

using namespace std::chrono_literals;
using troupe::bytes;
using troupe::errc;
using troupe::to_bytes;

namespace {

/// Runs `f` and returns the troupe::error it throws (fails the test if none).
template <class F>
troupe::error error_of(F&& f) {
  try {
    f();
  } catch (const troupe::error& e) {
    return e;
  }
  FAIL("expected a troupe::error");
  return troupe::error(errc::internal, "unreachable");
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// A unique file under /tmp (made with mkstemp), removed when this goes away.
class temp_path {
 public:
  temp_path() {
    char name[] = "/tmp/troupe_test_store_XXXXXX";
    int fd = ::mkstemp(name);
    REQUIRE(fd >= 0);
    ::close(fd);
    path_ = name;
  }
  ~temp_path() { ::unlink(path_.c_str()); }
  temp_path(const temp_path&) = delete;
  temp_path& operator=(const temp_path&) = delete;
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

constexpr auto long_timeout = troupe::store::duration(10s);

struct hash_fixture {
  std::shared_ptr<troupe::store> s = std::make_shared<troupe::hash_store>(long_timeout);
};

struct file_fixture {
  temp_path path;
  std::shared_ptr<troupe::store> s = std::make_shared<troupe::file_store>(path.str(), long_timeout);
};

struct prefix_fixture {
  std::shared_ptr<troupe::store> inner = std::make_shared<troupe::hash_store>(long_timeout);
  std::shared_ptr<troupe::store> s = std::make_shared<troupe::prefix_store>("pfx", inner);
};

/// A tcp_store whose server actor lives in this process (it talks to it directly).
struct tcp_local_fixture {
  std::shared_ptr<troupe::store> s = [] {
    troupe::tcp_store_options o;
    o.token = "job-secret-1";
    o.timeout = long_timeout;
    o.is_server = true;
    return std::make_shared<troupe::tcp_store>("127.0.0.1", 0, o);
  }();
};

/// A tcp_store client reaching a tcp_store_server over TCP (through the gate).
struct tcp_remote_fixture {
  troupe::tcp_store_server server{"127.0.0.1", 0, "job-secret-1"};
  std::shared_ptr<troupe::store> s = [this] {
    troupe::tcp_store_options o;
    o.token = "job-secret-1";
    o.timeout = long_timeout;
    return std::make_shared<troupe::tcp_store>("127.0.0.1", server.port(), o);
  }();
};

#define ALL_STORES hash_fixture, file_fixture, prefix_fixture, tcp_local_fixture, tcp_remote_fixture

}  // namespace

TEST_CASE("to_bytes, to_string and errc names") {
  CHECK(to_bytes("ab") == bytes{'a', 'b'});
  CHECK(troupe::to_string(bytes{'h', 'i'}) == "hi");
  CHECK(troupe::to_string(to_bytes("")).empty());
  CHECK(std::string(troupe::to_string(errc::timeout)) == "timeout");
  CHECK(std::string(troupe::to_string(errc::invalid_argument)) == "invalid_argument");
  CHECK(std::string(troupe::to_string(errc::store)) == "store");
  CHECK(std::string(troupe::to_string(errc::internal)) == "internal");
}

TEST_CASE_TEMPLATE("store: set, get and overwrite", F, ALL_STORES) {
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
}

TEST_CASE_TEMPLATE("store: add", F, ALL_STORES) {
  F f;
  auto& s = *f.s;
  CHECK(s.add("n", 5) == 5);
  CHECK(s.add("n", 3) == 8);
  CHECK(s.add("n", -10) == -2);
  CHECK(s.add("n", 0) == -2);
  CHECK(s.get_string("n") == "-2");  // stored as a decimal string
  s.set("m", "40");
  CHECK(s.add("m", 2) == 42);

  s.set("word", "abc");
  auto e = error_of([&] { s.add("word", 1); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK(contains(e.what(), "word'"));  // prefix_store names "pfx/word"
  CHECK(contains(e.what(), "abc"));
  CHECK(s.get_string("word") == "abc");  // unchanged
}

TEST_CASE_TEMPLATE("store: compare_set", F, ALL_STORES) {
  F f;
  auto& s = *f.s;
  // Absent key, empty expected: sets desired.
  CHECK(s.compare_set("a", {}, to_bytes("x")) == to_bytes("x"));
  CHECK(s.get_string("a") == "x");
  // Absent key, non-empty expected: returns expected, changes nothing.
  CHECK(s.compare_set("b", to_bytes("exp"), to_bytes("y")) == to_bytes("exp"));
  CHECK_FALSE(s.check({"b"}));
  // Current equals expected: sets desired.
  CHECK(s.compare_set("a", to_bytes("x"), to_bytes("z")) == to_bytes("z"));
  CHECK(s.get_string("a") == "z");
  // Current differs: returns current, changes nothing.
  CHECK(s.compare_set("a", to_bytes("nope"), to_bytes("w")) == to_bytes("z"));
  CHECK(s.get_string("a") == "z");
  // Present key, empty expected: differs from the current value.
  CHECK(s.compare_set("a", {}, to_bytes("w")) == to_bytes("z"));
}

TEST_CASE_TEMPLATE("store: check and wait", F, ALL_STORES) {
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
  auto e = error_of([&] { s.wait({"present_key", "absent_key"}, 50ms); });
  CHECK(std::chrono::steady_clock::now() - start >= 50ms);
  CHECK(e.code() == errc::timeout);
  CHECK(contains(e.what(), "Timed out"));
  CHECK(contains(e.what(), "50 ms"));
  CHECK(contains(e.what(), "absent_key"));
  CHECK_FALSE(contains(e.what(), "present_key"));  // only the missing keys

  auto e2 = error_of([&] { s.wait({"gone1", "gone2"}, 50ms); });
  CHECK(contains(e2.what(), "gone1"));
  CHECK(contains(e2.what(), "gone2"));
}

TEST_CASE_TEMPLATE("store: get times out", F, ALL_STORES) {
  F f;
  auto& s = *f.s;
  s.set_timeout(50ms);
  auto start = std::chrono::steady_clock::now();
  auto e = error_of([&] { s.get("never_set"); });
  CHECK(std::chrono::steady_clock::now() - start >= 50ms);
  CHECK(e.code() == errc::timeout);
  CHECK(contains(e.what(), "Timed out"));
  CHECK(contains(e.what(), "50 ms"));
  CHECK(contains(e.what(), "never_set"));
  CHECK(contains(e.what(), ".get"));
}

TEST_CASE_TEMPLATE("store: delete_key and num_keys", F, ALL_STORES) {
  F f;
  auto& s = *f.s;
  CHECK(s.num_keys() == 0);
  CHECK_FALSE(s.delete_key("k"));
  s.set("k", "v");
  s.set("j", "v");
  CHECK(s.num_keys() == 2);
  s.add("counter", 1);
  CHECK(s.num_keys() == 3);
  CHECK(s.delete_key("k"));
  CHECK_FALSE(s.check({"k"}));
  CHECK_FALSE(s.delete_key("k"));
  CHECK(s.num_keys() == 2);
}

TEST_CASE_TEMPLATE("store: append", F, ALL_STORES) {
  F f;
  auto& s = *f.s;
  s.append("log", to_bytes("ab"));  // creates the key
  CHECK(s.get_string("log") == "ab");
  s.append("log", to_bytes("cd"));
  CHECK(s.get_string("log") == "abcd");
  s.append("log", {});
  CHECK(s.get_string("log") == "abcd");
}

TEST_CASE_TEMPLATE("store: multi_get and multi_set", F, ALL_STORES) {
  F f;
  auto& s = *f.s;
  s.multi_set({"m1", "m2", "m3"}, {to_bytes("one"), to_bytes("two"), to_bytes("three")});
  auto values = s.multi_get({"m3", "m1", "m2"});
  REQUIRE(values.size() == 3);
  CHECK(troupe::to_string(values[0]) == "three");
  CHECK(troupe::to_string(values[1]) == "one");
  CHECK(troupe::to_string(values[2]) == "two");
  CHECK(s.multi_get({}).empty());
  s.multi_set({}, {});

  auto e = error_of([&] {
    s.multi_set({"x", "y"}, {to_bytes("1"), to_bytes("2"), to_bytes("3")});
  });
  CHECK(e.code() == errc::invalid_argument);
  CHECK(contains(e.what(), "2 keys"));
  CHECK(contains(e.what(), "3 values"));
  CHECK_FALSE(s.check({"x"}));

  s.set_timeout(50ms);
  auto t = error_of([&] { s.multi_get({"m1", "missing_a", "missing_b"}); });
  CHECK(t.code() == errc::timeout);
  CHECK(contains(t.what(), "Timed out"));
  CHECK(contains(t.what(), "50 ms"));
  CHECK(contains(t.what(), "missing_a"));
  CHECK(contains(t.what(), "missing_b"));
}

TEST_CASE_TEMPLATE("store: blocking get and wait are released by another thread", F, ALL_STORES) {
  F f;
  auto& s = *f.s;
  std::thread setter([&] {
    std::this_thread::sleep_for(30ms);
    s.set("late", "arrived");
    std::this_thread::sleep_for(30ms);
    s.set("later", "too");
  });
  CHECK(s.get_string("late") == "arrived");
  s.wait({"late", "later"});
  CHECK(s.get_string("later") == "too");
  setter.join();
}

TEST_CASE_TEMPLATE("store: concurrent adds lose nothing", F, ALL_STORES) {
  F f;
  auto& s = *f.s;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) s.add("c", 1);
    });
  }
  for (auto& t : threads) t.join();
  CHECK(s.add("c", 0) == 400);
}

TEST_CASE_TEMPLATE("store_based_barrier: all ranks arrive", F, ALL_STORES) {
  F f;
  std::atomic<int> passed{0};
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 4; ++rank) {
    threads.emplace_back([&, rank] {
      std::this_thread::sleep_for(std::chrono::milliseconds(10 * rank));
      troupe::store_based_barrier(*f.s, rank, 4, "group_a", 5s);
      ++passed;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(passed == 4);
  CHECK(f.s->get_string("store_based_barrier_key:group_a") == "4");
}

TEST_CASE("store_based_barrier: timeout lists the missing ranks") {
  troupe::hash_store s(long_timeout);
  std::string messages[2];
  errc codes[2] = {errc::internal, errc::internal};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      try {
        troupe::store_based_barrier(s, i * 2, 4, "group_b", 100ms);
      } catch (const troupe::error& e) {
        codes[i] = e.code();
        messages[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    CAPTURE(messages[i]);
    CHECK(codes[i] == errc::timeout);
    CHECK(contains(messages[i], "Timed out initializing process group in store based barrier"));
    CHECK(contains(messages[i], "rank " + std::to_string(i * 2)));
    CHECK(contains(messages[i], "store_based_barrier_key:group_b"));
    CHECK(contains(messages[i], "world_size=4"));
    CHECK(contains(messages[i], "num_workers_joined=2"));
    CHECK(contains(messages[i], "missing ranks: [1, 3]"));
  }

  auto e = error_of([&] { troupe::store_based_barrier(s, 4, 4, "group_c", 100ms); });
  CHECK(e.code() == errc::invalid_argument);
}

TEST_CASE("prefix_store: prefixes keep stores apart") {
  auto inner = std::make_shared<troupe::hash_store>(long_timeout);
  troupe::prefix_store a("a", inner);
  troupe::prefix_store b("b", inner);
  CHECK(a.prefix() == "a");
  CHECK(a.underlying() == inner);
  a.set("k", "from a");
  CHECK_FALSE(b.check({"k"}));
  CHECK(inner->get_string("a/k") == "from a");
  b.set("k", "from b");
  CHECK(a.get_string("k") == "from a");
  CHECK(b.get_string("k") == "from b");
  CHECK(a.add("n", 2) == 2);
  CHECK(b.add("n", 5) == 5);
  CHECK(b.delete_key("k"));
  CHECK(a.check({"k"}));
  // num_keys counts every key of the inner store (as c10d does).
  CHECK(a.num_keys() == inner->num_keys());
  CHECK(a.num_keys() == 3);

  // Nested prefixes compose.
  auto outer = std::make_shared<troupe::prefix_store>("outer", inner);
  troupe::prefix_store nested("inner", outer);
  nested.set("k", "deep");
  CHECK(inner->get_string("outer/inner/k") == "deep");
}

TEST_CASE("prefix_store: uses its own timeout; rejects a null store") {
  auto inner = std::make_shared<troupe::hash_store>(long_timeout);
  troupe::prefix_store p("p", inner);
  CHECK(p.timeout() == long_timeout);
  p.set_timeout(50ms);
  auto e = error_of([&] { p.get("x"); });
  CHECK(e.code() == errc::timeout);
  CHECK(contains(e.what(), "prefix_store.get"));
  CHECK(contains(e.what(), "'p/x'"));

  auto n = error_of([] { troupe::prefix_store("q", nullptr); });
  CHECK(n.code() == errc::invalid_argument);
}

TEST_CASE("file_store: objects on one path share data and exclude each other") {
  temp_path path;
  troupe::file_store one(path.str(), long_timeout);
  troupe::file_store two(path.str(), long_timeout);
  CHECK(one.path() == path.str());
  one.set("k", "v");
  CHECK(two.get_string("k") == "v");

  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      troupe::store& s = t % 2 ? static_cast<troupe::store&>(one) : two;
      for (int i = 0; i < 200; ++i) s.add("c", 1);
    });
  }
  for (auto& t : threads) t.join();
  CHECK(one.add("c", 0) == 800);

  // A later object sees what earlier ones wrote.
  troupe::file_store three(path.str(), long_timeout);
  CHECK(three.num_keys() == 2);
  CHECK(three.get_string("c") == "800");
}

TEST_CASE("file_store: a path that cannot be opened") {
  auto e = error_of([] { troupe::file_store("/nonexistent_dir_troupe/store", 1s); });
  CHECK(e.code() == errc::store);
  CHECK(contains(e.what(), "/nonexistent_dir_troupe/store"));
  CHECK(contains(e.what(), "No such file or directory"));
}

TEST_CASE("file_store: forked processes") {
  temp_path path;
  troupe::file_store s(path.str(), long_timeout);
  constexpr int children = 4;
  constexpr int adds = 200;
  std::vector<pid_t> pids;
  for (int c = 0; c < children; ++c) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int rc = 0;
      try {
        troupe::file_store mine(path.str(), 5s);
        for (int i = 0; i < adds; ++i) mine.add("counter", 1);
        if (c == 0) {
          std::this_thread::sleep_for(20ms);
          mine.set("from_child", "hello parent");
        }
        // Wait for the parent's go-ahead, to check blocking across processes.
        mine.wait({"parent_done"});
      } catch (...) {
        rc = 1;
      }
      ::_exit(rc);  // never return into doctest
    }
    pids.push_back(pid);
  }
  for (int i = 0; i < adds; ++i) s.add("counter", 1);
  CHECK(s.get_string("from_child") == "hello parent");  // blocks until the child sets it
  s.set("parent_done", "1");
  for (pid_t pid : pids) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  CHECK(s.get_string("counter") == std::to_string((children + 1) * adds));
}
