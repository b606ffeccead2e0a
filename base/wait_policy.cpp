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

}  // namespace

wait_policy wait_policy::from_env() {
  wait_policy p;
  p.spin = microseconds_from_env("TROUPE_SPIN_US", p.spin);
  const char* spin = std::getenv("TROUPE_SPIN_US");
  p.spin_chosen = spin && *spin;
  p.poll = microseconds_from_env("TROUPE_POLL_US", p.poll);
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
    for (int i = 0; i < 16; ++i) cpu_relax();
  return true;
}

}  // namespace troupe::detail
