#include "base/wait_policy.hpp"

#include <sched.h>
#include <unistd.h>

#include <cstdlib>
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
/// this host than it has CPUs.
bool on_cpu_of_its_own() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0 || CPU_COUNT(&set) != 1) return false;
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  if (!local || !*local) local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (!local || !*local) return false;
  char* end = nullptr;
  const long ranks = std::strtol(local, &end, 10);
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  return *end == '\0' && ranks >= 1 && cpus >= ranks;
}

}  // namespace

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
  static const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
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
