// Environment settings: TROUPE_DEBUG (get_debug_level) and LOCAL_RANK
// (node_local_rank), as c10d's TORCH_DISTRIBUTED_DEBUG and local rank.

#include <doctest/doctest.h>
#include <sys/wait.h>
#include "check_error.hpp"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "../base/engine_setting.hpp"
#include "../base/wait_policy.hpp"
#include "troupe/debug.hpp"
#include "troupe/error.hpp"
#include "troupe/store.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using troupe::test::check_error;

namespace {

/// Sets (or unsets) an environment variable for one scope, then restores it.
class scoped_env {
 public:
  scoped_env(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    set(value);
  }
  ~scoped_env() { set(old_); }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

 private:
  void set(const std::optional<std::string>& v) {
    if (v)
      ::setenv(name_, v->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

// -- TROUPE_DEBUG ----------------------------------------------------------------------------

TEST_CASE("TROUPE_DEBUG unset means OFF") {
  scoped_env env{"TROUPE_DEBUG", std::nullopt};
  CHECK(get_debug_level() == debug_level::off);
}

TEST_CASE("TROUPE_DEBUG empty means OFF") {
  scoped_env env{"TROUPE_DEBUG", ""};
  CHECK(get_debug_level() == debug_level::off);
}

TEST_CASE("TROUPE_DEBUG=off") {
  scoped_env env{"TROUPE_DEBUG", "off"};
  CHECK(get_debug_level() == debug_level::off);
}

TEST_CASE("TROUPE_DEBUG=Info, in any letter case") {
  for (const char* v : {"Info", "INFO", "info"}) {
    CAPTURE(v);
    scoped_env env{"TROUPE_DEBUG", v};
    CHECK(get_debug_level() == debug_level::info);
  }
}

TEST_CASE("TROUPE_DEBUG=DETAIL") {
  for (const char* v : {"DETAIL", "detail", "Detail"}) {
    CAPTURE(v);
    scoped_env env{"TROUPE_DEBUG", v};
    CHECK(get_debug_level() == debug_level::detail);
  }
}

TEST_CASE("an invalid TROUPE_DEBUG names the variable, its value and the accepted values") {
  for (const char* v : {"verbose", "2", " info", "INFO "}) {
    CAPTURE(v);
    scoped_env env{"TROUPE_DEBUG", v};
    check_error([] { (void)get_debug_level(); }, errc::invalid_argument,
                {"TROUPE_DEBUG", "'" + std::string(v) + "'", "OFF, INFO and DETAIL"});
  }
}

TEST_CASE("debug levels print as c10d spells them") {
  CHECK(std::string(to_string(debug_level::off)) == "OFF");
  CHECK(std::string(to_string(debug_level::info)) == "INFO");
  CHECK(std::string(to_string(debug_level::detail)) == "DETAIL");
}

// -- LOCAL_RANK --------------------------------------------------------------------------------

TEST_CASE("node_local_rank reads LOCAL_RANK") {
  scoped_env env{"LOCAL_RANK", "3"};
  CHECK(node_local_rank() == 3);
  CHECK(node_local_rank(7) == 3);  // the variable wins over the fallback
}

TEST_CASE("node_local_rank accepts zero") {
  scoped_env env{"LOCAL_RANK", "0"};
  CHECK(node_local_rank() == 0);
}

TEST_CASE("node_local_rank uses the fallback when LOCAL_RANK is unset") {
  scoped_env env{"LOCAL_RANK", std::nullopt};
  CHECK(node_local_rank(5) == 5);
  CHECK(node_local_rank(0) == 0);
}

TEST_CASE("node_local_rank without LOCAL_RANK or fallback names LOCAL_RANK") {
  scoped_env env{"LOCAL_RANK", std::nullopt};
  check_error([] { (void)node_local_rank(); }, errc::invalid_argument,
              {"node_local_rank", "LOCAL_RANK", "not set"});
}

TEST_CASE("node_local_rank rejects a LOCAL_RANK that is not a non-negative integer") {
  for (const char* v : {"abc", "-1", "2x", "", "1.5", "99999999999999999999"}) {
    CAPTURE(v);
    scoped_env env{"LOCAL_RANK", v};
    check_error([] { (void)node_local_rank(4); }, errc::invalid_argument,
                {"LOCAL_RANK='" + std::string(v) + "'", "non-negative integer"});
  }
}

TEST_CASE("scoped_env restores the previous value") {
  scoped_env outer{"LOCAL_RANK", "9"};
  {
    scoped_env inner{"LOCAL_RANK", "1"};
    CHECK(node_local_rank() == 1);
  }
  CHECK(node_local_rank() == 9);
}

// -- the wait windows (TROUPE_*_US) and TROUPE_ENGINE (checked when a world starts) ------------

namespace {

/// Starts a one-rank world (the settings are read at start-up).
void start_world() {
  world_options o;
  o.store = std::make_shared<hash_store>();
  o.rank = 0;
  o.world_size = 1;
  world w{o};
}

}  // namespace

TEST_CASE("a world refuses wait windows that are not microseconds from 0 to 1000000") {
  for (const char* name : {"TROUPE_SPIN_US", "TROUPE_POLL_US", "TROUPE_GPU_WATCH_US"})
    for (const char* v : {"abc", "-1", "5us", "1000001"}) {
      CAPTURE(name);
      CAPTURE(v);
      scoped_env env{name, v};
      check_error([] { start_world(); }, errc::invalid_argument,
                  {name, "microseconds", "'" + std::string(v) + "'"});
    }
  scoped_env spin{"TROUPE_SPIN_US", "0"};
  scoped_env poll{"TROUPE_POLL_US", "20"};
  scoped_env watch{"TROUPE_GPU_WATCH_US", "2000"};
  start_world();
  CHECK(detail::wait_policy::from_env().gpu_watch == std::chrono::microseconds{2000});
}

TEST_CASE("waits do not spin when the host's ranks outnumber its CPUs, unless told to") {
  const int cpus = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  const auto p = detail::wait_policy::from_env();
  CHECK(p.spin > std::chrono::nanoseconds{0});
  CHECK(p.for_ranks(cpus).spin == p.spin);
  CHECK(p.for_ranks(0).spin == p.spin);  // not known
  CHECK(p.for_ranks(cpus + 1).spin == std::chrono::nanoseconds{0});
  CHECK(p.for_ranks(cpus + 1).poll == p.poll);
  scoped_env spin{"TROUPE_SPIN_US", "3"};
  const auto chosen = detail::wait_policy::from_env();
  CHECK(chosen.for_ranks(cpus + 1).spin == std::chrono::microseconds{3});
}

TEST_CASE("a rank on a CPU of its own spins longer before it yields; every rank polls 1 ms") {
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  const auto usual = std::chrono::nanoseconds{1'000};
  cpu_set_t mine;
  CPU_ZERO(&mine);
  REQUIRE(::sched_getaffinity(0, sizeof(mine), &mine) == 0);
  int first = 0;
  while (!CPU_ISSET(first, &mine)) ++first;
  // A thread bound to one CPU, as troupe-run binds a rank's process.
  std::chrono::nanoseconds alone{}, crowded{}, unknown{};
  std::chrono::nanoseconds alone_poll{}, crowded_poll{}, chosen_poll{};
  std::thread bound([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (::pthread_setaffinity_np(::pthread_self(), sizeof(one), &one) != 0) return;
    {
      scoped_env local{"LOCAL_WORLD_SIZE", "1"};
      alone = detail::wait_policy::from_env().spin;
      alone_poll = detail::wait_policy::from_env().poll;
      scoped_env poll{"TROUPE_POLL_US", "70"};
      chosen_poll = detail::wait_policy::from_env().poll;
    }
    {
      scoped_env local{"LOCAL_WORLD_SIZE", std::to_string(cpus + 1)};
      crowded = detail::wait_policy::from_env().spin;
      crowded_poll = detail::wait_policy::from_env().poll;
    }
    {
      scoped_env local{"LOCAL_WORLD_SIZE", std::nullopt};
      scoped_env ompi{"OMPI_COMM_WORLD_LOCAL_SIZE", std::nullopt};
      unknown = detail::wait_policy::from_env().spin;
    }
  });
  bound.join();
  CHECK(alone == detail::own_cpu_spin);
  // Every rank polls (yielding) 1 ms before it sleeps, on a CPU of its own
  // or not: a sleeping waiter must be woken, and on a CPU its host's ranks
  // share the wake-up waits for that CPU.
  CHECK(alone_poll == std::chrono::milliseconds{1});
  CHECK(crowded_poll == std::chrono::milliseconds{1});
  CHECK(chosen_poll == std::chrono::microseconds{70});
  CHECK(crowded == usual);  // the host's ranks outnumber its CPUs
  CHECK(unknown == usual);  // no launcher said how many ranks share the host
  {
    scoped_env spin{"TROUPE_SPIN_US", "2"};
    scoped_env local{"LOCAL_WORLD_SIZE", "1"};
    CHECK(detail::wait_policy::from_env().spin == std::chrono::microseconds{2});
  }
  if (CPU_COUNT(&mine) > 1) {  // this thread is not bound
    scoped_env local{"LOCAL_WORLD_SIZE", "1"};
    CHECK(detail::wait_policy::from_env().spin == usual);
  }
}

TEST_CASE("ranks their launcher confined together to fewer CPUs share them: no long spin") {
  // A launcher (the first child) runs on one CPU, as a host's share of the
  // CPUs given by taskset or a container's cpuset; its rank (the second
  // child) is bound to that CPU, one of 2 ranks on the host. It must not
  // spin as if the CPU were its own (the machine's other CPUs are not the
  // host's), nor when it waits on the host's 2 ranks.
  cpu_set_t mine;
  CPU_ZERO(&mine);
  REQUIRE(::sched_getaffinity(0, sizeof(mine), &mine) == 0);
  int first = 0;
  while (!CPU_ISSET(first, &mine)) ++first;
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (::sched_setaffinity(0, sizeof(one), &one) != 0) ::_exit(2);
    const pid_t rank = ::fork();
    if (rank == 0) {
      ::setenv("LOCAL_WORLD_SIZE", "2", 1);
      ::unsetenv("TROUPE_SPIN_US");
      const auto p = detail::wait_policy::from_env();
      const bool ok = detail::host_cpus() == 1 && p.spin < detail::own_cpu_spin &&
                      p.for_ranks(2).spin == std::chrono::nanoseconds{0};
      ::_exit(ok ? 0 : 1);
    }
    int status = 0;
    ::waitpid(rank, &status, 0);
    ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 3);
  }
  int status = 0;
  ::waitpid(launcher, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("CPU lists count as Linux writes them") {
  CHECK(detail::count_cpu_list("0") == 1);
  CHECK(detail::count_cpu_list("0-3,8,10-11") == 7);
  CHECK(detail::count_cpu_list("2-2\n") == 1);
  CHECK(detail::count_cpu_list("") == 0);
  CHECK(detail::count_cpu_list("3-1") == 0);
  CHECK(detail::count_cpu_list("a") == 0);
  CHECK(detail::count_cpu_list("1;2") == 0);
}

TEST_CASE("a world refuses a TROUPE_ENGINE that is not inline, messages, staged or actors") {
  {
    scoped_env env{"TROUPE_ENGINE", "fast"};
    check_error([] { start_world(); }, errc::invalid_argument,
                {"TROUPE_ENGINE", "'fast'", "inline, messages, staged, actors"});
  }
  for (const char* v : {"inline", "messages", "staged", "actors", ""}) {
    scoped_env env{"TROUPE_ENGINE", v};
    start_world();
  }
}

TEST_CASE("TROUPE_FABRIC, TROUPE_ENGINE's former name, is read where TROUPE_ENGINE is unset") {
  scoped_env unset{"TROUPE_ENGINE", std::nullopt};
  {
    scoped_env env{"TROUPE_FABRIC", "off"};
    CHECK(detail::read_engine_setting() == detail::engine_setting::actors);
  }
  {
    scoped_env env{"TROUPE_FABRIC", "on"};
    CHECK(detail::read_engine_setting() == detail::engine_setting::inline_engine);
  }
  {
    scoped_env env{"TROUPE_FABRIC", "fast"};
    check_error([] { start_world(); }, errc::invalid_argument,
                {"TROUPE_FABRIC", "'fast'", "on, off, staged, messages"});
  }
  {
    scoped_env env{"TROUPE_FABRIC", "off"};
    scoped_env wins{"TROUPE_ENGINE", "messages"};
    CHECK(detail::read_engine_setting() == detail::engine_setting::messages);
  }
}
