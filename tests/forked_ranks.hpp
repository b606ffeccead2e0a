#pragma once
// Helpers of the tests that run one rank per forked child process and look
// at what each rank saw: forking, a memory page the children share, error
// checks that print what they found, and this process's RSS and threads.

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "children.hpp"
#include "troupe/troupe.hpp"

namespace troupe::test {

/// Forks one child per rank; child r runs body(r) and exits 0 when it
/// returned true (1 when false or when it threw, after saying why).
inline std::vector<int> fork_ranks(int n, const std::function<bool(int)>& body) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      bool ok = false;
      try {
        ok = body(r);
        if (!ok) std::fprintf(stderr, "rank %d: its checks found a wrong result\n", r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::fflush(stderr);
      ::_exit(ok ? 0 : 1);
    }
    pids.push_back(pid);
  }
  return wait_for_children(pids);
}

/// Memory the children of this process share with it (and each other).
template <class T>
T* shared_page() {
  void* p = ::mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return new (p) T{};
}

/// The options of a world of `size` ranks on store `s`.
inline world_options child_world(std::shared_ptr<store> s, int rank, int size,
                                 std::chrono::milliseconds timeout) {
  world_options o;
  o.store = std::move(s);
  o.rank = rank;
  o.world_size = size;
  o.timeout = timeout;
  o.token = "0123456789abcdef";
  return o;
}

/// A rank in a forked child per entry of `hosts`, rank r naming host
/// hosts[r] (TROUPE_HOSTNAME: TCP between ranks of different hosts) after
/// `environment(r)` set the rest of its environment; each runs `body` on
/// its world of one file store, then waits for every rank before leaving.
/// The children's exit codes (0: body said right).
inline std::vector<int> fork_hosts(const std::vector<std::string>& hosts,
                                   const std::function<void(int)>& environment,
                                   const std::function<bool(world&)>& body) {
  const int n = static_cast<int>(hosts.size());
  const auto path = temp_store_path();
  auto codes = fork_ranks(n, [&](int r) {
    ::setenv("TROUPE_HOSTNAME", hosts[static_cast<std::size_t>(r)].c_str(), 1);
    environment(r);
    auto s = std::make_shared<file_store>(path, std::chrono::seconds(30));
    world w{child_world(s, r, n, std::chrono::seconds(30))};
    const bool ok = body(w);
    w.default_group().barrier().wait();
    return ok;
  });
  ::unlink(path.c_str());
  return codes;
}

/// Nanoseconds on the clock every process of this host shares (steady_clock
/// is CLOCK_MONOTONIC).
inline long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// A line of /proc/self/status as a number ("VmRSS:" in KiB, "Threads:").
inline long status_value(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(key.size()));
  return -1;
}

/// Says on stderr, and answers, whether `what` holds; `rank` names the teller.
inline bool expect(int rank, bool ok, const std::string& what) {
  if (!ok) std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  return ok;
}

}  // namespace troupe::test
