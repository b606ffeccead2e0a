// cost_model (cost_model.hpp): the links' costs and their settings
// (TROUPE_LINK_COSTS, ranks sharing CPUs), the striped hierarchy's slices
// and the algorithms' names. What a step costs: cost_steps.hpp; what each
// algorithm costs, and the choice: algorithm_costs.cpp.

#include "algorithms/cost_model.hpp"

#include "algorithms/algorithm.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include "troupe/error.hpp"

namespace troupe::detail {
namespace {

[[noreturn]] void bad(const std::string& text, const std::string& why) {
  throw error(errc::invalid_argument, "TROUPE_LINK_COSTS '" + text + "': " + why);
}

/// What a quantity measures, by its units.
enum class unit_kind { time, rate, size };

/// "50us" -> 5e-5; "1.25GB/s" -> 1.25e9; "10Gbit/s" -> 1.25e9; "4MiB" ->
/// 4194304. `zero`: 0 is a value (a wait), else only positive ones.
double quantity(const std::string& text, const std::string& v, unit_kind kind, bool zero = false) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  const std::string unit = end;
  if (end == v.c_str() || !(x > 0 || (zero && x == 0)))
    bad(text,
        "'" + v + "' is not a " + (zero ? "non-negative" : "positive") + " number with a unit");
  using units = std::vector<std::pair<const char*, double>>;
  static const units times{{"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}};
  static const units rates{{"B/s", 1},          {"KB/s", 1e3},      {"MB/s", 1e6},
                           {"GB/s", 1e9},       {"bit/s", 1.0 / 8}, {"Kbit/s", 1e3 / 8},
                           {"Mbit/s", 1e6 / 8}, {"Gbit/s", 1e9 / 8}};
  static const units sizes{{"B", 1},         {"KB", 1e3},      {"MB", 1e6},     {"GB", 1e9},
                           {"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}};
  const units& known = kind == unit_kind::time ? times : kind == unit_kind::rate ? rates : sizes;
  for (const auto& [name, factor] : known)
    if (unit == name) return x * factor;
  bad(text, "'" + v + "' has no " +
                (kind == unit_kind::time   ? "time unit (us, ...)"
                 : kind == unit_kind::rate ? "rate unit (GB/s, Gbit/s, ...)"
                                           : "size unit (B, KiB, MiB, GiB, ...)"));
}

}  // namespace

int hier_segments(std::uint64_t bytes, const cost_model& m) {
  // Read at each call (a getenv: little beside a call across hosts), so a
  // process forked after the first call still follows its own setting.
  std::uint64_t segment = m.host.bandwidth * 8 <= m.local.bandwidth ? std::uint64_t{4} << 20 : 0;
  if (const char* v = std::getenv("TROUPE_HIER_SEGMENT"); v && *v) {
    char* end = nullptr;
    segment = std::strtoull(v, &end, 10);
    if (end == v || *end != '\0')
      throw error(errc::invalid_argument,
                  std::string("TROUPE_HIER_SEGMENT '") + v + "' is not a number of bytes");
  }
  if (segment == 0 || bytes < 2 * segment) return 1;
  return static_cast<int>(std::min<std::uint64_t>(bytes / segment, 16));
}

int chain_segments(std::uint64_t bytes, int ranks) {
  constexpr std::uint64_t least = std::uint64_t{64} << 10, most = std::uint64_t{1} << 20;
  const std::uint64_t hops = static_cast<std::uint64_t>(std::max(ranks - 1, 1));
  const std::uint64_t segment = std::clamp(bytes / (4 * hops), least, most);
  return static_cast<int>(std::max<std::uint64_t>(1, (bytes + segment - 1) / segment));
}

const cost_model& cost_model::of_process() {
  static std::once_flag once;
  static cost_model m;
  std::call_once(once, [] {
    if (const char* v = std::getenv("TROUPE_LINK_COSTS"); v && *v) m = parse(v);
  });
  return m;
}

cost_model cost_model::on_shared_cpus() const {
  if (!(ranks_per_cpu > 1) || latencies_shared) return *this;
  cost_model m = *this;
  const double wait = std::pow(ranks_per_cpu, shared_wait);
  // The wait for the CPU is the receiving rank's, whichever link brought
  // the message: a round across hosts takes `wait` times as long, and a
  // hop within a host waits as long for its rank's CPU.
  const double turn = (wait - 1) * host.latency;
  const double for_the_cpu = hop_wait >= 0 ? hop_wait : turn;
  for (link_cost* l : {&m.host, &m.local}) {
    l->latency += for_the_cpu;
    l->overhead *= ranks_per_cpu;
  }
  m.cpu_turn = turn;
  m.latencies_shared = true;
  return m;
}

cost_model cost_model::link_alone() const {
  constexpr double unbounded = 1e200;  // finite: no inf - inf anywhere
  cost_model m;
  m.host = {0, host.bandwidth, 0};
  m.local = {0, unbounded, 0};
  m.cpu_rate = unbounded;
  m.hop_wait = 0;
  m.shared_wait = 0;
  m.cache = cache;
  return m;
}

cost_model cost_model::link_unbounded() const {
  cost_model m = *this;
  m.host.bandwidth = 1e200;
  m.burst = 0;
  return m;
}

cost_model cost_model::of_call(double bytes) const {
  cost_model m = *this;
  if (bytes <= cache) {
    if (cpu_cached_rate > 0) m.cpu_rate = cpu_cached_rate;
    if (local_cached_rate > 0) m.local.bandwidth = local_cached_rate;
    if (send_share_cached >= 0) m.send_share = send_share_cached;
  }
  return m;
}

cost_model cost_model::parse(const std::string& text, const cost_model& base) {
  cost_model m = base;
  std::size_t at = 0;
  while (at < text.size()) {
    auto end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const auto item = text.substr(at, end - at);
    at = end + 1;
    const auto eq = item.find('='), colon = item.find(':');
    // The plain numbers: ranks_per_cpu (1 to 1e6), shared_wait (0 to 10),
    // cpu_send, cpu_send_cached and wait_share (0 to 1).
    const auto number = [&](const char* name, double lo, double hi, const char* range, double& to) {
      if (eq == std::string::npos || item.compare(0, eq, name) != 0) return false;
      const auto v = item.substr(eq + 1);
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(x >= lo) || !(x <= hi))
        bad(text, std::string(name) + " '" + v + "' is not a number from " + range);
      to = x;
      return true;
    };
    if (item == "measure") {
      m.measure = true;
      continue;
    }
    if (number("ranks_per_cpu", 1, 1e6, "1 to 1e6", m.ranks_per_cpu)) {
      m.ranks_per_cpu_given = true;
      continue;
    }
    if (number("shared_wait", 0, 10, "0 to 10", m.shared_wait)) continue;
    if (number("cpu_send", 0, 1, "0 to 1", m.send_share)) continue;
    if (number("cpu_send_cached", 0, 1, "0 to 1", m.send_share_cached)) continue;
    if (number("wait_share", 0, 1, "0 to 1", m.wait_share)) continue;
    // The quantities with a unit: NAME=VALUE.
    const auto named = [&](const char* name) {
      return eq != std::string::npos && item.compare(0, eq, name) == 0;
    };
    const auto value = item.substr(eq == std::string::npos ? item.size() : eq + 1);
    if (named("hop_wait")) {
      m.hop_wait = quantity(text, value, unit_kind::time, true);
      continue;
    }
    if (named("overhead")) {
      m.host.overhead = quantity(text, value, unit_kind::time, true);
      continue;
    }
    if (named("cpu")) {
      m.cpu_rate = quantity(text, value, unit_kind::rate);
      continue;
    }
    if (named("cpu_cached")) {
      m.cpu_cached_rate = quantity(text, value, unit_kind::rate);
      continue;
    }
    if (named("local_cached")) {
      m.local_cached_rate = quantity(text, value, unit_kind::rate);
      continue;
    }
    if (named("cache")) {
      m.cache = quantity(text, value, unit_kind::size);
      continue;
    }
    if (named("burst")) {
      m.burst = quantity(text, value, unit_kind::size, true);
      continue;
    }
    if (eq == std::string::npos || colon == std::string::npos || colon < eq)
      bad(text, "'" + item +
                    "' is not NAME=LATENCY:BANDWIDTH, cpu=RATE, cpu_cached=RATE, "
                    "local_cached=RATE, cpu_send=SHARE, cpu_send_cached=SHARE, cache=SIZE, "
                    "burst=SIZE, ranks_per_cpu=K, shared_wait=E, hop_wait=TIME, wait_share=SHARE, "
                    "overhead=TIME or measure");
    const auto name = item.substr(0, eq);
    if (name != "host" && name != "local")
      bad(text, "'" + name + "' is not a link class (host, local)");
    // An empty latency or bandwidth keeps the default's ("host=:1Gbit/s").
    auto& link = name == "host" ? m.host : m.local;
    const auto latency = item.substr(eq + 1, colon - eq - 1), rate = item.substr(colon + 1);
    if (!latency.empty()) link.latency = quantity(text, latency, unit_kind::time);
    if (!rate.empty()) link.bandwidth = quantity(text, rate, unit_kind::rate);
  }
  return m;
}

std::shared_ptr<const cost_model> cost_model::of_measured(const std::string& text) {
  return text.empty() ? nullptr : std::make_shared<const cost_model>(parse(text));
}

cost_model cost_model::with_sharing(double found) const {
  cost_model m = *this;
  if (found > 1 && !ranks_per_cpu_given) m.ranks_per_cpu = std::min(found, 1e6);
  return m;
}

std::string cost_model::to_text() const {
  char text[320];
  std::snprintf(text, sizeof(text),
                "host=%.6gus:%.6gB/s,local=%.6gus:%.6gB/s,cpu=%.6gB/s,ranks_per_cpu=%.6g,"
                "shared_wait=%.6g",
                host.latency * 1e6, host.bandwidth, local.latency * 1e6, local.bandwidth, cpu_rate,
                ranks_per_cpu, shared_wait);
  std::string out = text;
  if (hop_wait >= 0) {
    std::snprintf(text, sizeof(text), ",hop_wait=%.6gus", hop_wait * 1e6);
    out += text;
  }
  if (host.overhead != cost_model{}.host.overhead) {
    std::snprintf(text, sizeof(text), ",overhead=%.6gus", host.overhead * 1e6);
    out += text;
  }
  if (cpu_cached_rate > 0) {
    std::snprintf(text, sizeof(text), ",cpu_cached=%.6gB/s", cpu_cached_rate);
    out += text;
  }
  if (local_cached_rate > 0) {
    std::snprintf(text, sizeof(text), ",local_cached=%.6gB/s", local_cached_rate);
    out += text;
  }
  if (send_share != 0.5) {
    std::snprintf(text, sizeof(text), ",cpu_send=%.6g", send_share);
    out += text;
  }
  if (send_share_cached >= 0) {
    std::snprintf(text, sizeof(text), ",cpu_send_cached=%.6g", send_share_cached);
    out += text;
  }
  if (wait_share != 0.5) {
    std::snprintf(text, sizeof(text), ",wait_share=%.6g", wait_share);
    out += text;
  }
  if (cpu_cached_rate > 0 || local_cached_rate > 0 || send_share_cached >= 0) {
    std::snprintf(text, sizeof(text), ",cache=%.0fB", cache);
    out += text;
  }
  if (burst > 0) {
    std::snprintf(text, sizeof(text), ",burst=%.0fB", burst);
    out += text;
  }
  return out;
}

const char* to_string(algorithm_kind k) noexcept {
  switch (k) {
    case algorithm_kind::allreduce_direct:
      return "allreduce_direct";
    case algorithm_kind::allreduce_pair:
      return "allreduce_pair";
    case algorithm_kind::allreduce_halves:
      return "allreduce_halves";
    case algorithm_kind::allreduce_ring:
      return "allreduce_ring";
    case algorithm_kind::allreduce_recursive_doubling:
      return "allreduce_recursive_doubling";
    case algorithm_kind::allreduce_rabenseifner:
      return "allreduce_rabenseifner";
    case algorithm_kind::allreduce_hier_striped:
      return "allreduce_hier (striped)";
    case algorithm_kind::allreduce_hier_leaders:
      return "allreduce_hier (leaders)";
    case algorithm_kind::broadcast_binomial:
      return "broadcast_binomial";
    case algorithm_kind::broadcast_scatter_allgather:
      return "broadcast_scatter_allgather";
    case algorithm_kind::broadcast_hier:
      return "broadcast_hier";
    case algorithm_kind::broadcast_chain:
      return "broadcast_chain";
    case algorithm_kind::broadcast_chain_leaders:
      return "broadcast_chain (leaders)";
    case algorithm_kind::reduce_chain:
      return "reduce_chain";
    case algorithm_kind::reduce_chain_leaders:
      return "reduce_chain (leaders)";
    case algorithm_kind::allgather_ring:
      return "allgather_ring";
    case algorithm_kind::allgather_bruck:
      return "allgather_bruck";
    case algorithm_kind::allgather_recursive_doubling:
      return "allgather_recursive_doubling";
    case algorithm_kind::allgather_hier_striped:
      return "allgather_hier (striped)";
    case algorithm_kind::allgather_hier_leaders:
      return "allgather_hier (leaders)";
    case algorithm_kind::reduce_binomial:
      return "reduce_binomial";
    case algorithm_kind::reduce_hier:
      return "reduce_hier";
    case algorithm_kind::alltoall_pairwise:
      return "alltoall_pairwise";
    case algorithm_kind::alltoall_bruck:
      return "alltoall_bruck";
    case algorithm_kind::reduce_scatter_ring:
      return "reduce_scatter_ring";
    case algorithm_kind::reduce_scatter_halving:
      return "reduce_scatter_halving";
    case algorithm_kind::reduce_scatter_hier_striped:
      return "reduce_scatter_hier (striped)";
    case algorithm_kind::reduce_scatter_hier_leaders:
      return "reduce_scatter_hier (leaders)";
    case algorithm_kind::other:
      return "other";
  }
  return "?";
}

}  // namespace troupe::detail
