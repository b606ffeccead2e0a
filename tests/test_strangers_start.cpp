// A process without the job's token (tests/stranger.cpp), opening
// connections to a port of the job — the store's, or rank 0's data plane —
// keeps no 2-rank job from starting: it holds 1000 idle connections
// (reopening each one the server drops) or floods the port with connections
// as fast as it can, and the job's start and its running calls are timed
// with and without it, in the same test: for ranks in forked processes
// (rank 0 hosts the store, as under torchrun) and for a job started by
// troupe-run (which serves the store). Rank 0's data-plane port is attacked
// while rank 1, stopped right after reading it from the store, waits to
// connect there (tests/pausing_store.hpp). The start must stay under 5 s (a
// generous bound on a noisy machine; it takes well under a second), and the
// measured numbers are printed.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "forked_ranks.hpp"
#include "loopback.hpp"
#include "pausing_store.hpp"
#include "troupe/tcp_store.hpp"

extern char** environ;

using namespace troupe;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

namespace {

const std::string token = "0123456789abcdef";

/// A program started with its stdout and stderr on pipes, read as they come.
struct child_process {
  pid_t pid = -1;
  int fds[2] = {-1, -1};
  std::string out, err;

  /// Starts `argv` with this process's environment less `drop`, plus `add`.
  child_process(std::vector<std::string> argv, const std::vector<std::string>& drop,
                const std::vector<std::string>& add = {}) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string entry = *e;
      bool dropped = false;
      for (const auto& d : drop) dropped |= entry.rfind(d + "=", 0) == 0;
      if (!dropped) env.push_back(entry);
    }
    env.insert(env.end(), add.begin(), add.end());
    std::vector<char*> a, e;
    for (auto& s : argv) a.push_back(s.data());
    for (auto& s : env) e.push_back(s.data());
    a.push_back(nullptr);
    e.push_back(nullptr);
    int out[2], err[2];
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execve(a[0], a.data(), e.data());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    fds[0] = out[0];
    fds[1] = err[0];
  }
  ~child_process() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }

  /// Reads until `done()` or both pipes ended or `timeout`; whether done.
  bool read_until(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    const auto until = steady::now() + timeout;
    while (!done()) {
      std::vector<pollfd> p;
      for (int fd : fds)
        if (fd >= 0) p.push_back({fd, POLLIN, 0});
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(until - steady::now());
      if (p.empty() || left.count() <= 0) return false;
      if (::poll(p.data(), p.size(), static_cast<int>(left.count())) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (fds[i] < 0) continue;
        pollfd one{fds[i], POLLIN, 0};
        if (::poll(&one, 1, 0) <= 0) continue;
        char buf[4096];
        const auto n = ::read(fds[i], buf, sizeof(buf));
        if (n > 0) {
          (i == 0 ? out : err).append(buf, static_cast<std::size_t>(n));
        } else {
          ::close(fds[i]);
          fds[i] = -1;
        }
      }
    }
    return true;
  }

  /// Reads everything and waits for the exit (SIGKILL after `timeout`); the exit code.
  int finish(std::chrono::milliseconds timeout) {
    const bool ended = read_until([&] { return fds[0] < 0 && fds[1] < 0; }, timeout);
    if (!ended) ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
    return !ended ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

/// The attacker: tests/stranger.cpp, started without the job's token.
struct stranger {
  child_process p;
  explicit stranger(std::vector<std::string> args)
      : p(
            [&] {
              args.insert(args.begin(), STRANGER);
              return args;
            }(),
            {"TROUPE_JOB_TOKEN"}) {}
  /// Waits until the attack is in force.
  bool ready() {
    return p.read_until([&] { return p.out.find("ready\n") != std::string::npos; }, 20s);
  }
  /// Stops it; what it says it did.
  std::string stop() {
    ::kill(p.pid, SIGTERM);
    p.finish(5s);
    const auto at = p.out.find("stranger: ");
    return at == std::string::npos ? "(no summary)" : p.out.substr(at, p.out.find('\n', at) - at);
  }
};

/// What a job measured: its start (the world's construction on rank 1) and 100 calls.
struct timing {
  long world_ms = -1;
  long calls_ms = -1;
  std::string stranger;  // what the stranger did
};

enum class target { store, data_plane };

std::vector<std::string> with_port(std::vector<std::string> args, int port) {
  args.push_back(std::to_string(port));
  return args;
}

/// What the forked ranks tell the test.
struct board {
  std::atomic<long> world_ms{-1};
  std::atomic<long> calls_ms{-1};
  std::atomic<int> plane_port{0};  // rank 0's, read by rank 1, which then waits for go
  std::atomic<bool> go{false};
};

/// Two ranks in forked processes over TCP, rank 0 hosting the store at a
/// known port (env:// under torchrun). The stranger (`args`; none when
/// empty) attacks `t`: the store's port before rank 1 starts, or rank 0's
/// data-plane port while rank 1 waits, stopped right after reading it from
/// the store. Rank 1's start is timed from its start or from the go.
timing forked_job(target t, const std::vector<std::string>& args) {
  const auto port = test::free_port();
  auto& b = *test::shared_page<board>();
  b.world_ms = -1;
  b.calls_ms = -1;
  b.plane_port = 0;
  b.go = false;
  auto rank = [&](int r) {
    ::setenv("TROUPE_TRANSPORT", "tcp", 1);
    auto start = steady::now();
    tcp_store_options o;
    o.is_server = r == 0;
    o.server_name = "rank 0";
    o.token = token;
    o.timeout = 30s;
    std::shared_ptr<store> s = std::make_shared<tcp_store>("127.0.0.1", port, o);
    if (t == target::data_plane && r == 1)
      s = std::make_shared<test::pausing_store>(
          s, [](const std::string& key) { return test::pausing_store::is_address_of(key, 0); },
          [&](const bytes& address) {
            b.plane_port = test::pausing_store::port_of(address);
            for (auto until = steady::now() + 30s; !b.go && steady::now() < until;)
              std::this_thread::sleep_for(1ms);
            start = steady::now();
          });
    world w{test::child_world(s, r, 2, 30s)};
    const auto built = steady::now();
    auto& pg = w.default_group();
    pg.barrier().wait();
    const auto calls = steady::now();
    for (int i = 0; i < 50; ++i) {
      auto x = tensor::from_vector<int>({1});
      pg.allreduce(x).wait();
      if (x.to_vector<int>()[0] != 2) return false;
      const auto key = "calls/" + std::to_string(r) + "/" + std::to_string(i);
      s->set(key, "v");
      if (s->get_string(key) != "v") return false;
    }
    if (r == 1) {
      b.world_ms = std::chrono::duration_cast<std::chrono::milliseconds>(built - start).count();
      b.calls_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - calls).count();
    }
    pg.barrier().wait();
    return true;
  };
  auto fork_rank = [&](int r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      bool ok = false;
      try {
        ok = rank(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      ::_exit(ok ? 0 : 1);
    }
    return pid;
  };
  // This process starts no thread of its own: forking stays safe.
  const pid_t rank0 = fork_rank(0);
  std::unique_ptr<stranger> attacker;
  pid_t rank1 = -1;
  if (t == target::store) {
    if (!args.empty()) attacker = std::make_unique<stranger>(with_port(args, port));
    if (attacker) REQUIRE(attacker->ready());
    std::this_thread::sleep_for(200ms);  // the attack runs a while before rank 1 comes
    rank1 = fork_rank(1);
  } else {
    rank1 = fork_rank(1);
    for (auto until = steady::now() + 30s; b.plane_port == 0 && steady::now() < until;)
      std::this_thread::sleep_for(1ms);
    REQUIRE(b.plane_port > 0);
    if (!args.empty()) attacker = std::make_unique<stranger>(with_port(args, b.plane_port));
    if (attacker) REQUIRE(attacker->ready());
    std::this_thread::sleep_for(200ms);  // the attack runs a while before rank 1 connects
    b.go = true;
  }
  const auto codes = test::wait_for_children({rank0, rank1});
  CHECK(codes == std::vector<int>{0, 0});
  timing out;
  if (attacker) out.stranger = attacker->stop();
  out.world_ms = b.world_ms;
  out.calls_ms = b.calls_ms;
  return out;
}

void report(const std::string& what, const timing& plain, const timing& attacked) {
  MESSAGE(what << ": the job started in " << attacked.world_ms << " ms (" << plain.world_ms
               << " ms without the stranger), 100 calls took " << attacked.calls_ms << " ms ("
               << plain.calls_ms << " ms without); " << attacked.stranger);
  CHECK(plain.world_ms >= 0);
  CHECK(attacked.world_ms >= 0);
  CHECK(attacked.world_ms < 5000);  // under a second measured; generous for a noisy machine
  CHECK(attacked.calls_ms >= 0);
  CHECK(attacked.calls_ms < plain.calls_ms + 5000);
}

}  // namespace

TEST_CASE("forked ranks: a stranger on the store's port does not hold up the start") {
  const auto plain = forked_job(target::store, {});
  report("forked ranks, store port, 1000 idle connections held", plain,
         forked_job(target::store, {"hold", "1000"}));
  report("forked ranks, store port, 1000 connections held that sent a byte", plain,
         forked_job(target::store, {"nibble", "1000"}));
  report("forked ranks, store port, a flood of connections", plain,
         forked_job(target::store, {"flood"}));
}

TEST_CASE("forked ranks: a stranger on rank 0's data-plane port does not hold up the start") {
  const auto plain = forked_job(target::data_plane, {});
  report("forked ranks, data-plane port, 1000 idle connections held", plain,
         forked_job(target::data_plane, {"hold", "1000"}));
  report("forked ranks, data-plane port, 1000 connections held that sent a byte", plain,
         forked_job(target::data_plane, {"nibble", "1000"}));
  report("forked ranks, data-plane port, a flood of connections", plain,
         forked_job(target::data_plane, {"flood"}));
}

#ifdef TROUPE_RUN

namespace {

/// A 2-rank job of strangers_rank started by troupe-run (which serves the
/// store at a known --master-port); its ranks start once the stranger
/// (`args`; none when empty) attacks `t`.
timing launched_job(target t, const std::vector<std::string>& args) {
  const auto port = test::free_port();
  const auto go = test::temp_store_path(), port_file = test::temp_store_path();
  std::vector<std::string> env = {"STRANGERS_GO=" + go, "TROUPE_JOB_TOKEN=" + token};
  if (t == target::data_plane) env.push_back("STRANGERS_PORT_FILE=" + port_file);
  std::unique_ptr<stranger> attacker;
  if (t == target::store && !args.empty())
    attacker = std::make_unique<stranger>(with_port(args, port));
  child_process job({TROUPE_RUN, "-n", "2", "--master-port", std::to_string(port), STRANGERS_RANK},
                    {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TROUPE_JOB_TOKEN",
                     "TROUPE_STORE_EXTERNAL"},
                    env);
  if (t == target::data_plane) {
    // Rank 1 read rank 0's data-plane port from the store and waits before connecting there.
    int plane_port = 0;
    for (auto until = steady::now() + 30s; plane_port == 0 && steady::now() < until;) {
      std::ifstream in(port_file);
      if (!(in >> plane_port)) std::this_thread::sleep_for(5ms);
    }
    REQUIRE(plane_port > 0);
    if (!args.empty()) attacker = std::make_unique<stranger>(with_port(args, plane_port));
  }
  if (attacker) REQUIRE(attacker->ready());
  std::this_thread::sleep_for(200ms);  // the attack runs a while before the ranks come
  std::ofstream(go) << "go\n";
  const int code = job.finish(60s);
  INFO("stdout:\n"
       << job.out << "stderr (last 2000 bytes):\n"
       << job.err.substr(job.err.size() > 2000 ? job.err.size() - 2000 : 0));
  CHECK(code == 0);
  timing out;
  if (attacker) out.stranger = attacker->stop();
  std::smatch m;
  const std::regex line(R"(\[1\] world 1: built in (\d+) ms; 100 calls in (\d+) ms)");
  if (std::regex_search(job.out, m, line)) {
    out.world_ms = std::stol(m[1]);
    out.calls_ms = std::stol(m[2]);
  }
  ::unlink(go.c_str());
  ::unlink(port_file.c_str());
  return out;
}

}  // namespace

TEST_CASE("troupe-run: a stranger on the store's port does not hold up the start") {
  const auto plain = launched_job(target::store, {});
  report("troupe-run, store port, 1000 idle connections held", plain,
         launched_job(target::store, {"hold", "1000"}));
  report("troupe-run, store port, 1000 connections held that sent a byte", plain,
         launched_job(target::store, {"nibble", "1000"}));
  report("troupe-run, store port, a flood of connections", plain,
         launched_job(target::store, {"flood"}));
}

TEST_CASE("troupe-run: a stranger on rank 0's data-plane port does not hold up the start") {
  const auto plain = launched_job(target::data_plane, {});
  report("troupe-run, data-plane port, 1000 idle connections held", plain,
         launched_job(target::data_plane, {"hold", "1000"}));
  report("troupe-run, data-plane port, 1000 connections held that sent a byte", plain,
         launched_job(target::data_plane, {"nibble", "1000"}));
  report("troupe-run, data-plane port, a flood of connections", plain,
         launched_job(target::data_plane, {"flood"}));
}

#endif
