// Tests for troupe-run, the launcher: it runs as a separate program here on
// launcher_child (tests/launcher_child.cpp), and each case checks its output,
// the children's environment and its exit status.
#include <doctest/doctest.h>

#ifndef TROUPE_RUN

TEST_CASE("troupe-run is not built (TROUPE_BUILD_EXAMPLES=OFF): launcher tests skipped") {
  MESSAGE("skipped: troupe-run is built only with TROUPE_BUILD_EXAMPLES=ON");
}

#else

#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "loopback.hpp"
#include "troupe/tcp_store.hpp"

extern char** environ;

using namespace std::chrono_literals;

namespace {

using steady = std::chrono::steady_clock;
using env_changes = std::vector<std::pair<std::string, std::string> >;

const std::string child = LAUNCHER_CHILD;

/// troupe-run started with its stdout and stderr on pipes.
struct launched {
  pid_t pid = -1;
  int fds[2] = {-1, -1};
  std::string out, err;
  steady::time_point started = steady::now();
  int status = -1;  ///< exit code, 128+S for signal S; -1 when it had to be killed
  double seconds = 0;
};

launched start(const std::vector<std::string>& args, const env_changes& changes = {}) {
  // The launchers' own variables come only from `changes`.
  const std::set<std::string> dropped = {"RANK",
                                         "WORLD_SIZE",
                                         "LOCAL_RANK",
                                         "LOCAL_WORLD_SIZE",
                                         "MASTER_ADDR",
                                         "MASTER_PORT",
                                         "TROUPE_JOB_TOKEN",
                                         "OMPI_COMM_WORLD_SIZE",
                                         "OMPI_COMM_WORLD_RANK",
                                         "SLURM_NTASKS",
                                         "SLURM_PROCID"};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    if (dropped.count(entry.substr(0, entry.find('='))) == 0) env.push_back(entry);
  }
  for (const auto& [name, value] : changes) env.push_back(name + "=" + value);
  std::vector<std::string> argv_s = {TROUPE_RUN};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  for (auto& a : argv_s) argv.push_back(a.data());
  for (auto& e : env) envp.push_back(e.data());
  argv.push_back(nullptr);
  envp.push_back(nullptr);

  launched l;
  int out[2], err[2];
  REQUIRE(::pipe(out) == 0);
  REQUIRE(::pipe(err) == 0);
  l.pid = ::fork();
  REQUIRE(l.pid >= 0);
  if (l.pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(99);
  }
  ::close(out[1]);
  ::close(err[1]);
  l.fds[0] = out[0];
  l.fds[1] = err[0];
  return l;
}

/// Reads output until `done(l)` or both pipes end or `timeout`; true if done.
bool read_until(launched& l, const std::function<bool(const launched&)>& done,
                std::chrono::milliseconds timeout) {
  const auto until = steady::now() + timeout;
  while (!done(l)) {
    std::vector<pollfd> fds;
    for (int fd : l.fds) {
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - steady::now());
    if (fds.empty() || left.count() <= 0) return false;
    if (::poll(fds.data(), fds.size(), static_cast<int>(left.count())) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (l.fds[i] < 0) continue;
      pollfd p{l.fds[i], POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) continue;
      char buf[4096];
      ssize_t n = ::read(l.fds[i], buf, sizeof buf);
      if (n > 0) {
        (i == 0 ? l.out : l.err).append(buf, static_cast<std::size_t>(n));
      } else {
        ::close(l.fds[i]);
        l.fds[i] = -1;
      }
    }
  }
  return true;
}

/// Reads all output and waits for the exit (killing troupe-run after 8 s).
launched& finish(launched& l) {
  auto ended = [](const launched& x) { return x.fds[0] < 0 && x.fds[1] < 0; };
  bool ok = read_until(l, ended, std::chrono::seconds(8));
  if (!ok) ::kill(l.pid, SIGKILL);
  int st = 0;
  ::waitpid(l.pid, &st, 0);
  for (int& fd : l.fds) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  l.seconds = std::chrono::duration<double>(steady::now() - l.started).count();
  l.status = !ok ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  INFO("stdout:\n" << l.out << "stderr:\n" << l.err);
  CHECK_MESSAGE(ok, "troupe-run did not finish within 8 s");
  return l;
}

launched run(const std::vector<std::string>& args, const env_changes& changes = {}) {
  launched l = start(args, changes);
  finish(l);
  return l;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

/// The "env" lines of the ranks: prefix rank -> NAME -> value.
std::map<int, std::map<std::string, std::string> > env_lines(const std::string& out) {
  std::map<int, std::map<std::string, std::string> > ranks;
  for (const std::string& line : lines_of(out)) {
    if (line.size() < 4 || line[0] != '[') continue;
    int rank = std::stoi(line.substr(1));
    std::istringstream words(line.substr(line.find("] ") + 2));
    for (std::string w; words >> w;)
      ranks[rank][w.substr(0, w.find('='))] = w.substr(w.find('=') + 1);
  }
  return ranks;
}

std::string fnv_hex(const std::string& s) {
  std::uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : s) hash = (hash ^ c) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

/// On a failed check, show what troupe-run printed.
#define SHOW_OUTPUT(l) INFO("stdout:\n" << (l).out << "stderr:\n" << (l).err)

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("one node: ranks 0..N-1 share a free port and a generated 32-hex-char token") {
  launched l = run({"-n", "3", child, "env"});
  SHOW_OUTPUT(l);
  CHECK(l.status == 0);
  auto ranks = env_lines(l.out);
  REQUIRE(ranks.size() == 3);
  const auto& first = ranks.at(0);
  int port = std::stoi(first.at("MASTER_PORT"));
  CHECK(port > 0);
  CHECK(port < 65536);
  for (int r = 0; r < 3; ++r) {
    auto& e = ranks.at(r);
    CHECK(e.at("RANK") == std::to_string(r));
    CHECK(e.at("WORLD_SIZE") == "3");
    CHECK(e.at("LOCAL_RANK") == std::to_string(r));
    CHECK(e.at("LOCAL_WORLD_SIZE") == "3");
    CHECK(e.at("MASTER_ADDR") == "127.0.0.1");
    CHECK(e.at("MASTER_PORT") == first.at("MASTER_PORT"));
    CHECK(e.at("TOKEN_LEN") == "32");
    CHECK(e.at("TOKEN_HEX") == "1");
    CHECK(e.at("TOKEN_HASH") == first.at("TOKEN_HASH"));
  }
}

TEST_CASE("a TROUPE_JOB_TOKEN, --master-addr and --master-port given are passed on") {
  launched l = run({"-n", "2", "--master-addr", "localhost", "--master-port=29511", child, "env"},
                   {{"TROUPE_JOB_TOKEN", "my-token"}});
  SHOW_OUTPUT(l);
  CHECK(l.status == 0);
  auto ranks = env_lines(l.out);
  REQUIRE(ranks.size() == 2);
  for (auto& [rank, e] : ranks) {
    CHECK(e.at("MASTER_ADDR") == "localhost");
    CHECK(e.at("MASTER_PORT") == "29511");
    CHECK(e.at("TOKEN_LEN") == "8");
    CHECK(e.at("TOKEN_HASH") == fnv_hex("my-token"));
  }
}

TEST_CASE("several nodes: RANK = node_rank*N + local rank, WORLD_SIZE = N*nnodes") {
  launched l = run({"--nnodes", "2", "--node-rank", "1", "-n", "2", "--master-port", "29500", "--",
                    child, "env"},
                   {{"TROUPE_JOB_TOKEN", "0123456789abcdef"}});
  SHOW_OUTPUT(l);
  CHECK(l.status == 0);
  auto ranks = env_lines(l.out);
  REQUIRE(ranks.size() == 2);
  for (int local = 0; local < 2; ++local) {
    auto& e = ranks.at(2 + local);
    CHECK(e.at("RANK") == std::to_string(2 + local));
    CHECK(e.at("WORLD_SIZE") == "4");
    CHECK(e.at("LOCAL_RANK") == std::to_string(local));
    CHECK(e.at("LOCAL_WORLD_SIZE") == "2");
    CHECK(e.at("MASTER_PORT") == "29500");
    CHECK(e.at("TOKEN_HASH") == fnv_hex("0123456789abcdef"));
  }

  SUBCASE("without --master-port") {
    launched m = run({"--nnodes", "2", "-n", "2", child, "env"}, {{"TROUPE_JOB_TOKEN", "t"}});
    SHOW_OUTPUT(m);
    CHECK(m.status == 2);
    CHECK(contains(m.err, "--master-port"));
    CHECK(m.out.empty());
  }
  SUBCASE("without TROUPE_JOB_TOKEN") {
    launched m = run({"--nnodes", "2", "-n", "2", "--master-port", "29500", child, "env"});
    SHOW_OUTPUT(m);
    CHECK(m.status == 2);
    CHECK(contains(m.err, "TROUPE_JOB_TOKEN"));
    CHECK(m.out.empty());
  }
  SUBCASE("a node rank out of range") {
    launched m = run({"--nnodes", "2", "--node-rank", "2", "-n", "1", "--master-port", "1", child});
    SHOW_OUTPUT(m);
    CHECK(m.status == 2);
    CHECK(contains(m.err, "--node-rank"));
  }
}

TEST_CASE("troupe-run serves the job's store; its ranks are told TROUPE_STORE_EXTERNAL=1") {
  launched l = run({"-n", "2", child, "store"});
  SHOW_OUTPUT(l);
  CHECK(l.status == 0);
  const auto ranks = env_lines(l.out);
  REQUIRE(ranks.size() == 2);
  for (const auto& [rank, e] : ranks) {
    CHECK(e.at("STORE_EXTERNAL") == "1");
    CHECK(e.at("ACK") == "1");  // it admitted the job's token
  }
  // Who serves, as the store tells its clients: troupe-run's own process.
  const auto served_by = "served by troupe-run (pid " + std::to_string(l.pid) + ") on host ";
  CHECK(contains(l.out, "[0] " + served_by));
  CHECK(contains(l.out, "[1] " + served_by));
}

TEST_CASE("TROUPE_STORE_EXTERNAL: 0 lets rank 0 host the store, 1 a store of one's own") {
  SUBCASE("0: rank 0 hosts it, nothing listens before it does") {
    launched l = run({"-n", "2", child, "store"}, {{"TROUPE_STORE_EXTERNAL", "0"}});
    SHOW_OUTPUT(l);
    CHECK(l.status == 0);
    for (const auto& [rank, e] : env_lines(l.out)) {
      CHECK(e.at("STORE_EXTERNAL") == "0");
      CHECK(e.at("ACK") == "refused");
    }
  }
  SUBCASE("1 without --master-port: a usage error") {
    launched l = run({"-n", "2", child, "env"}, {{"TROUPE_STORE_EXTERNAL", "1"}});
    SHOW_OUTPUT(l);
    CHECK(l.status == 2);
    CHECK(contains(l.err, "TROUPE_STORE_EXTERNAL=1"));
    CHECK(contains(l.err, "--master-port"));
    CHECK(l.out.empty());
  }
  SUBCASE("another value: a usage error naming it") {
    launched l = run({"-n", "1", child, "env"}, {{"TROUPE_STORE_EXTERNAL", "yes"}});
    SHOW_OUTPUT(l);
    CHECK(l.status == 2);
    CHECK(contains(l.err, "TROUPE_STORE_EXTERNAL='yes'"));
  }
}

TEST_CASE("node 0 serves the store on while other nodes' ranks still use it") {
  const int port = troupe::test::free_port();
  launched l = start({"--nnodes", "2", "--node-rank", "0", "-n", "1", "--master-port",
                      std::to_string(port), child, "pause", "300"},
                     {{"TROUPE_JOB_TOKEN", "0123456789abcdef"}});
  {
    // A rank of node 1, as far as node 0 can tell.
    troupe::tcp_store_options o;
    o.token = "0123456789abcdef";
    o.timeout = 5s;
    troupe::tcp_store other("127.0.0.1", static_cast<std::uint16_t>(port), o);
    other.set("k", "v");
    const bool said = read_until(
        l, [](const launched& x) { return contains(x.err, "serving the job's store while"); }, 5s);
    SHOW_OUTPUT(l);
    CHECK(said);
    CHECK(contains(l.out, "[0] done 0"));
    CHECK(::waitpid(l.pid, nullptr, WNOHANG) == 0);  // still serving
    CHECK(other.get_string("k") == "v");
  }
  finish(l);
  SHOW_OUTPUT(l);
  CHECK(l.status == 0);  // it ended once the other node's connection did
  CHECK(contains(l.err, "still use it (1 connection; SIGTERM stops it)"));
}

TEST_CASE("every line is prefixed with the rank, stdout to stdout and stderr to stderr") {
  launched l = run({"-n", "2", child, "lines"});
  SHOW_OUTPUT(l);
  CHECK(l.status == 0);
  for (const std::string r : {"0", "1"}) {
    const std::string p = "[" + r + "] ";
    CHECK(contains(l.out, p + "line one\n" + p + "line two\n"));
    CHECK(contains(l.out, p + "abcd\n"));     // written in two pieces, printed as one line
    CHECK(contains(l.out, p + "partial\n"));  // the last line had no newline
    CHECK(contains(l.err, p + "err one\n"));
    CHECK(!contains(l.out, "err one"));
  }
  for (const std::string& line : lines_of(l.out)) {
    CHECK_MESSAGE((line.rfind("[0] ", 0) == 0 || line.rfind("[1] ", 0) == 0), line);
  }
  CHECK(lines_of(l.out).size() == 8);
}

TEST_CASE("a failing rank stops the others; troupe-run exits with its code") {
  launched l = run({"-n", "3", child, "fail", "1"});
  SHOW_OUTPUT(l);
  CHECK(l.status == 3);
  CHECK(l.seconds < 5);  // the others would sleep 30 s
  CHECK(contains(l.err, "[1] failing 1"));
  CHECK(contains(l.err, "troupe-run: rank 1 (pid "));
  CHECK(contains(l.err, "failed with exit code 3; stopping the other ranks"));
}

TEST_CASE("--keep-going: a killed rank does not stop the others or fail the job") {
  launched l = run({"--keep-going", "-n", "3", child, "outlive", "1", "kill"});
  SHOW_OUTPUT(l);
  CHECK(l.status == 0);
  CHECK(contains(l.out, "[0] done 0"));
  CHECK(contains(l.out, "[2] done 2"));
  CHECK(contains(l.err, "killed by signal " + std::to_string(SIGUSR1) +
                            " (User defined signal 1); the other ranks go on (--keep-going)"));
}

TEST_CASE("--keep-going: a rank exiting with an error still fails the job, after the others") {
  launched l = run({"--keep-going", "-n", "3", child, "outlive", "2", "fail"});
  SHOW_OUTPUT(l);
  CHECK(l.status == 3);
  CHECK(contains(l.out, "[0] done 0"));
  CHECK(contains(l.out, "[1] done 1"));
  CHECK(contains(l.err, "failed with exit code 3; the other ranks go on (--keep-going)"));
}

TEST_CASE("a stopped rank is reported, named when the others fail, and ended by SIGTERM") {
  launched l = run({"-n", "3", child, "freeze", "2"});
  SHOW_OUTPUT(l);
  CHECK(l.status == 3);
  CHECK(l.seconds < 5);  // the stopped rank ends on SIGTERM (continued), not at the grace's SIGKILL
  CHECK(contains(l.err, "troupe-run: rank 2 (pid "));
  CHECK(contains(l.err, "was stopped by signal " + std::to_string(SIGSTOP)));
  CHECK(contains(l.err, "failed with exit code 3; rank 2 (pid "));
  CHECK(contains(l.err, "has been stopped for "));
  CHECK(!contains(l.err, "sending SIGKILL"));
}

TEST_CASE("ranks that ignore SIGTERM are killed after --grace-seconds") {
  launched l = run({"-n", "2", "--grace-seconds", "0.5", child, "fail", "0", "stubborn"});
  SHOW_OUTPUT(l);
  CHECK(l.status == 3);
  CHECK(l.seconds < 5);
  CHECK(contains(l.err, "rank 0 (pid "));
  CHECK(contains(l.err, "rank 1 still running after the 0.5 s grace period; sending SIGKILL"));
}

TEST_CASE("a rank killed by a signal: troupe-run exits with 128 + the signal") {
  launched l = run({"-n", "2", child, "kill", "0"});
  SHOW_OUTPUT(l);
  CHECK(l.status == 128 + SIGUSR1);
  CHECK(l.seconds < 5);
  CHECK(contains(l.err, "rank 0 (pid "));
  CHECK(contains(l.err, "killed by signal " + std::to_string(SIGUSR1)));
}

TEST_CASE("a program that cannot be run fails its rank with 127") {
  launched l = run({"-n", "1", "/nonexistent/program"});
  SHOW_OUTPUT(l);
  CHECK(l.status == 127);
  CHECK(contains(l.err, "[0] troupe-run: cannot run '/nonexistent/program'"));
}

TEST_CASE("SIGTERM to troupe-run is forwarded to every rank") {
  launched l = start({"-n", "2", child, "sleep"});
  bool ready = read_until(
      l,
      [](const launched& x) {
        return contains(x.out, "[0] ready 0\n") && contains(x.out, "[1] ready 1\n");
      },
      std::chrono::seconds(5));
  CHECK(ready);
  ::kill(l.pid, SIGTERM);
  finish(l);
  SHOW_OUTPUT(l);
  CHECK(l.status == 128 + SIGTERM);
  CHECK(contains(l.out, "[0] term 0\n"));
  CHECK(contains(l.out, "[1] term 1\n"));
  CHECK(contains(l.err, "received SIGTERM"));
  CHECK(!contains(l.err, "failed"));
}

TEST_CASE("--bind: core and auto give each rank one CPU, round robin; none leaves them free") {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(0, sizeof(set), &set) == 0);
  std::vector<std::string> usable;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) usable.push_back(std::to_string(c));
  std::string all;
  for (const auto& c : usable) all += (all.empty() ? "" : ",") + c;
  const int n = static_cast<int>(usable.size());
  // Ranks' CPU lists, by rank.
  auto cpus_of = [&](std::vector<std::string> args) {
    launched l = run(args);
    SHOW_OUTPUT(l);
    CHECK(l.status == 0);
    std::map<int, std::string> got;
    std::istringstream is(l.out);
    for (std::string line; std::getline(is, line);) {
      const auto close = line.find("] CPUS=");
      if (line.size() > 1 && line[0] == '[' && close != std::string::npos)
        got[std::stoi(line.substr(1, close - 1))] = line.substr(close + 7);
    }
    return got;
  };
  // A CPU per rank, and more ranks than CPUs (round robin).
  for (auto [bind, ranks] :
       {std::pair<std::string, int>{"auto", n}, {"core", n + 1}, {"auto", n + 1}}) {
    CAPTURE(bind);
    auto got = cpus_of({"-n", std::to_string(ranks), "--bind", bind, child, "cpus"});
    REQUIRE(got.size() == static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) CHECK(got[r] == usable[static_cast<std::size_t>(r % n)]);
  }
  // none: the launcher's own set.
  for (auto [bind, ranks] : {std::pair<std::string, int>{"none", 2}, {"none", n + 1}}) {
    CAPTURE(bind);
    auto got = cpus_of({"-n", std::to_string(ranks), "--bind", bind, child, "cpus"});
    REQUIRE(got.size() == static_cast<std::size_t>(ranks));
    for (auto& [r, list] : got) CHECK(list == all);
  }
  // The default is auto.
  auto dflt = cpus_of({"-n", "1", child, "cpus"});
  CHECK(dflt[0] == usable[0]);
}

TEST_CASE("argument errors exit 2 and name the option") {
  struct bad {
    std::vector<std::string> args;
    std::string named;
  };
  const std::vector<bad> cases = {
      {{child, "env"}, "-n"},
      {{"-n", "0", child}, "'0' for -n"},
      {{"-n", "abc", child}, "'abc' for -n"},
      {{"-n", "2x", child}, "'2x' for -n"},
      {{"-n"}, "-n needs a value"},
      {{"-n", "2", "--bogus", child}, "'--bogus'"},
      {{"-n", "2"}, "program"},
      {{"-n", "2", "--"}, "program"},
      {{"-n", "2", "--master-port", "70000", child}, "'70000' for --master-port"},
      {{"-n", "2", "--nnodes", "0", child}, "'0' for --nnodes"},
      {{"-n", "2", "--grace-seconds", "-1", child}, "'-1' for --grace-seconds"},
      {{"-n", "2", "--bind", "socket", child}, "'socket' for --bind"},
  };
  for (const bad& c : cases) {
    std::string joined;
    for (const auto& a : c.args) joined += a + " ";
    INFO("troupe-run " << joined);
    launched l = run(c.args);
    SHOW_OUTPUT(l);
    CHECK(l.status == 2);
    CHECK(contains(l.err, c.named));
    CHECK(contains(l.err, "Usage: troupe-run"));
  }
}

TEST_CASE("--help prints the usage and the mpirun/srun note, exit 0") {
  launched l = run({"--help"});
  SHOW_OUTPUT(l);
  CHECK(l.status == 0);
  CHECK(contains(l.out, "Usage: troupe-run -n N"));
  CHECK(contains(l.out, "mpirun"));
  CHECK(contains(l.out, "srun"));
}

TEST_CASE("under mpirun or srun the program runs once, in place, with a warning") {
  for (const std::string var : {"OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}) {
    INFO(var);
    launched l = run({"-n", "3", child, "env"}, {{var, "4"}});
    SHOW_OUTPUT(l);
    CHECK(l.status == 0);
    CHECK(contains(l.err, "warning"));
    CHECK(contains(l.err, "already launched"));
    auto lines = lines_of(l.out);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].rfind("RANK=unset WORLD_SIZE=unset", 0) == 0);  // no prefix, no RANK
  }
}

#endif  // TROUPE_RUN
