// The registered transports (transport/link.hpp): the built-in ones first,
// in the order "auto" tries them, then those programs register.

#include <algorithm>
#include <deque>
#include <mutex>

#include "transport/link.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {
namespace {

struct registry {
  std::mutex mtx;
  std::deque<transport_kind> kinds;  // a deque: entries stay where they are
};

registry& transports() {
  static registry r{{}, {shm_ring_transport()}};  // the built-in transports
  return r;
}

}  // namespace

void register_transport(transport_kind kind) {
  if (kind.name.empty() || kind.name == "auto" || kind.name == "tcp" || !kind.serves ||
      !kind.open_out || !kind.open_in)
    throw error(errc::invalid_argument,
                "register_transport: transport '" + kind.name +
                    "' needs a name other than auto and tcp, and serves, open_out and open_in");
  auto& r = transports();
  std::lock_guard<std::mutex> g{r.mtx};
  auto same = std::find_if(r.kinds.begin(), r.kinds.end(),
                           [&](const transport_kind& k) { return k.name == kind.name; });
  if (same != r.kinds.end())
    *same = std::move(kind);
  else
    r.kinds.push_back(std::move(kind));
}

const transport_kind* find_transport(const std::string& name) {
  auto& r = transports();
  std::lock_guard<std::mutex> g{r.mtx};
  for (const auto& k : r.kinds)
    if (k.name == name) return &k;
  return nullptr;
}

const transport_kind* transport_for(const std::string& setting, const link_pair& pair) {
  if (setting == "tcp") return nullptr;
  if (setting == "auto") {
    auto& r = transports();
    std::lock_guard<std::mutex> g{r.mtx};
    for (const auto& k : r.kinds)
      if (k.serves(pair)) return &k;
    return nullptr;
  }
  const auto* k = find_transport(setting);
  if (!k) throw error(errc::invalid_argument, "data plane: no transport named '" + setting + "'");
  return k->serves(pair) ? k : nullptr;
}

}  // namespace troupe::detail
