// What TROUPE_DEBUG prints (c10d's TORCH_DISTRIBUTED_DEBUG), captured from
// stderr: nothing when OFF; with INFO one line per group a rank creates
// (its name, ranks and backends); with DETAIL also one line when each call
// is issued (op and tensor) and one when it ends (sequence number and
// outcome).

#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "check_error.hpp"
#include "scoped_env.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::test::scoped_env;

namespace {

/// Sends this process's stderr into a file for one scope; text() reads what came.
class stderr_capture {
 public:
  stderr_capture() {
    char name[] = "/tmp/troupe_debug_XXXXXX";
    const int fd = ::mkstemp(name);
    REQUIRE(fd >= 0);
    path_ = name;
    std::fflush(stderr);
    saved_ = ::dup(2);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~stderr_capture() {
    restore();
    ::unlink(path_.c_str());
  }
  stderr_capture(const stderr_capture&) = delete;
  stderr_capture& operator=(const stderr_capture&) = delete;

  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::string text() const {
    std::fflush(stderr);
    std::ifstream in{path_};
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  /// The text once it holds every one of `lines` (a callback may print on
  /// another thread just after its work completed), or after 20 s.
  std::string text_with(const std::vector<std::string>& lines) const {
    const auto until = std::chrono::steady_clock::now() + 20s;
    for (;;) {
      auto t = text();
      bool all = true;
      for (auto& l : lines) all = all && t.find(l) != std::string::npos;
      if (all || std::chrono::steady_clock::now() > until) return t;
      std::this_thread::sleep_for(5ms);
    }
  }

 private:
  std::string path_;
  int saved_ = -1;
};

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (auto i = text.find(part); i != std::string::npos; i = text.find(part, i + 1)) ++n;
  return n;
}

/// Two ranks: a subgroup, an allreduce on the default group, a barrier on
/// the subgroup, and a call that fails (a receive past its timeout).
void program(world& w) {
  auto g = w.new_group({0, 1});
  auto t = tensor::from_vector<float>({1.0f, 2.0f});
  w.default_group().allreduce(t).wait();
  g->barrier().wait();
  if (w.rank() == 0) {
    auto r = tensor::zeros({3}, dtype::int32);
    CHECK_THROWS(g->recv(r, 1, {.tag = 5, .timeout = 50ms}).wait());
  }
  w.default_group().barrier().wait();
}

}  // namespace

TEST_CASE("TROUPE_DEBUG=OFF prints no group and no call lines") {
  scoped_env env{"TROUPE_DEBUG", "OFF"};
  stderr_capture cap;
  testing::run_ranks(2, program);
  const auto text = cap.text();
  cap.restore();
  INFO(text);
  // (The flight record a timeout dumps is not the debug level's.)
  CHECK(text.find("[troupe rank") == std::string::npos);
  CHECK(text.find("[troupe group") == std::string::npos);
  CHECK(text.find("flight record of group 'group1' rank 0") != std::string::npos);
}

TEST_CASE("TROUPE_DEBUG=INFO prints one line per group a rank creates") {
  scoped_env env{"TROUPE_DEBUG", "info"};
  stderr_capture cap;
  testing::run_ranks(2, program);
  const std::vector<std::string> lines{
      "[troupe rank 0] group 'default' ranks [0, 1] backend 'cpu:actor,cuda:actor'\n",
      "[troupe rank 1] group 'default' ranks [0, 1] backend 'cpu:actor,cuda:actor'\n",
      "[troupe rank 0] group 'group1' ranks [0, 1] backend 'cpu:actor,cuda:actor'\n",
      "[troupe rank 1] group 'group1' ranks [0, 1] backend 'cpu:actor,cuda:actor'\n"};
  const auto text = cap.text_with(lines);
  cap.restore();
  INFO(text);
  for (auto& l : lines) CHECK(count(text, l) == 1);
  CHECK(text.find(" issue ") == std::string::npos);  // no call lines at INFO
  CHECK(text.find(" done") == std::string::npos);
}

TEST_CASE("TROUPE_DEBUG=DETAIL also prints each call when issued and when it ends") {
  scoped_env env{"TROUPE_DEBUG", "Detail"};
  stderr_capture cap;
  testing::run_ranks(2, program);
  const std::vector<std::string> lines{
      // The groups, as with INFO.
      "[troupe rank 0] group 'default' ranks [0, 1] backend 'cpu:actor,cuda:actor'\n",
      "[troupe rank 1] group 'group1' ranks [0, 1] backend 'cpu:actor,cuda:actor'\n",
      // Issued: the op and its tensor; ended: the sequence number and the outcome.
      "[troupe group 'default' rank 0] issue allreduce tensor(float32, cpu, [2])\n",
      "[troupe group 'default' rank 1] issue allreduce tensor(float32, cpu, [2])\n",
      "[troupe group 'default' rank 0] allreduce seq 1 done\n",
      "[troupe group 'default' rank 1] allreduce seq 1 done\n",
      "[troupe group 'group1' rank 0] issue barrier",
      "[troupe group 'group1' rank 1] barrier seq 1 done\n",
      "[troupe group 'group1' rank 0] issue recv tensor(int32, cpu, [3])\n",
      "[troupe group 'group1' rank 0] recv seq 0 FAILED\n",
      "[troupe group 'default' rank 0] barrier seq 2 done\n",
      "[troupe group 'default' rank 1] barrier seq 2 done\n"};
  const auto text = cap.text_with(lines);
  cap.restore();
  INFO(text);
  for (auto& l : lines) CHECK(count(text, l) == 1);
  // Every issued call ends with one line (2 ranks: allreduce and two
  // barriers each, and rank 0's receive).
  CHECK(count(text, "] issue ") == 7);
  CHECK(count(text, " done\n") + count(text, " FAILED\n") == 7);
}

TEST_CASE("a world refuses a TROUPE_DEBUG it does not know, naming it") {
  scoped_env env{"TROUPE_DEBUG", "verbose"};
  troupe::test::check_error([] { testing::run_ranks(1, [](world&) {}); }, errc::invalid_argument,
                            {"TROUPE_DEBUG", "verbose", "OFF", "INFO", "DETAIL"});
}
