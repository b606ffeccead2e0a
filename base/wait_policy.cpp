#include "base/wait_policy.hpp"

#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>

#include "base/futex.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

namespace {

std::chrono::nanoseconds microseconds_from_env(const char* name, std::chrono::nanoseconds dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  const std::string s = v;
  std::size_t used = 0;
  long long us = -1;
  try {
    us = std::stoll(s, &used);
  } catch (const std::exception&) {
  }
  if (used != s.size() || us < 0 || us > 1'000'000)
    throw error(errc::invalid_argument, std::string(name) + ": expected microseconds from 0 to " +
                                            "1000000, got '" + s + "'");
  return std::chrono::microseconds(us);
}

/// Whether this process runs on a CPU of its own: bound to one CPU (by
/// troupe-run, or mpirun --bind-to core) in a job with no more ranks on
/// this host than the CPUs they may use.
bool on_cpu_of_its_own() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0 || CPU_COUNT(&set) != 1) return false;
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  if (!local || !*local) local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (!local || !*local) return false;
  char* end = nullptr;
  const long ranks = std::strtol(local, &end, 10);
  return *end == '\0' && ranks >= 1 && host_cpus() >= ranks;
}

}  // namespace

long count_cpu_list(const char* list) {
  long count = 0;
  const char* p = list;
  while (*p && *p != '\n') {
    char* end = nullptr;
    const long first = std::strtol(p, &end, 10);
    if (end == p || first < 0) return 0;
    long last = first;
    p = end;
    if (*p == '-') {
      last = std::strtol(p + 1, &end, 10);
      if (end == p + 1 || last < first) return 0;
      p = end;
    }
    count += last - first + 1;
    if (*p == ',')
      ++p;
    else if (*p && *p != '\n')
      return 0;
  }
  return count;
}

long host_cpus() {
  // Read once per process (a forked child reads its own parent's).
  static std::atomic<long> cached{0};
  static std::atomic<pid_t> cached_for{0};
  if (cached_for.load() == ::getpid()) return cached.load();
  const long cpus = [] {
    const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
    std::ifstream status("/proc/" + std::to_string(::getppid()) + "/status");
    std::string line;
    const std::string key = "Cpus_allowed_list:";
    while (std::getline(status, line)) {
      if (line.compare(0, key.size(), key) != 0) continue;
      auto at = line.find_first_not_of(" \t", key.size());
      const long allowed = at == std::string::npos ? 0 : count_cpu_list(line.c_str() + at);
      if (allowed > 0 && (online <= 0 || allowed < online)) return allowed;
      break;
    }
    return online;
  }();
  cached.store(cpus);
  cached_for.store(::getpid());
  return cpus;
}

wait_policy wait_policy::from_env() {
  wait_policy p;
  if (on_cpu_of_its_own()) p.spin = own_cpu_spin;
  p.spin = microseconds_from_env("TROUPE_SPIN_US", p.spin);
  const char* spin = std::getenv("TROUPE_SPIN_US");
  p.spin_chosen = spin && *spin;
  p.poll = microseconds_from_env("TROUPE_POLL_US", p.poll);
  p.gpu_watch = microseconds_from_env("TROUPE_GPU_WATCH_US", p.gpu_watch);
  return p;
}

const wait_policy& wait_policy::get() {
  static const wait_policy policy = from_env();
  return policy;
}

wait_policy wait_policy::for_ranks(int ranks) const {
  auto p = *this;
  const long cpus = host_cpus();
  if (ranks > cpus && cpus > 0 && !spin_chosen) p.spin = {};
  return p;
}

bool wait_policy::poll_step(std::chrono::nanoseconds polled) const {
  if (polled >= poll) return false;
  if (polled >= spin)
    ::sched_yield();
  else
    cpu_relax();
  return true;
}

}  // namespace troupe::detail
