// data_plane (data_plane.hpp): peers that are gone — one that left with a
// goodbye, one that died or broke its connection, one dropped for the frames
// it sent — and who hears of it.

#include "transport/data_plane.hpp"

#include <cstdio>

#include "transport/data_plane_parts.hpp"

namespace troupe::detail {

std::string data_plane::gone_reason(int r) {
  auto& p = at(r);
  if (!p.gone.load()) return {};
  std::lock_guard<std::mutex> g{mtx_};
  return p.gone_why;
}

std::string data_plane::crash_reason(int r) {
  auto& p = at(r);
  if (!p.gone.load()) return {};
  std::lock_guard<std::mutex> g{mtx_};
  return p.crashed ? p.gone_why : std::string();
}

void data_plane::peer_gone(int r, const std::string& why, bool crashed, int cause,
                           failure_kind kind) {
  auto& p = at(r);
  if (stopping_) return;
  std::vector<std::function<void(int, const std::string&, bool)>> targets;
  {
    std::lock_guard<std::mutex> g{mtx_};
    if (p.gone.load()) return;
    p.gone_why = why;
    p.crashed = crashed;
    p.gone.store(true);
    for (auto& kv : routes_)
      if (kv.second->actor.gone) targets.push_back(kv.second->actor.gone);
  }
  // Whom this rank's own goodbye will blame: the first failure it learned of.
  if (const int blame = cause >= 0 ? cause : crashed ? r : -1; blame >= 0) {
    int none = -1;
    first_cause_.compare_exchange_strong(none, blame * 256 + static_cast<int>(kind));
  }
  if (crashed) crashes_->fetch_add(1);
  // Sends to it fail at once (not under out_mtx: a writer blocked on the
  // full ring of a dead peer holds it until the ring closes).
  if (p.out_link) p.out_link->close();
  if (p.out_socket) p.out_socket->close();
  for (auto& t : targets) t(r, why, crashed);
}

void data_plane::reject(int r, const std::string& why) {
  if (stopping_ || at(r).gone.load()) return;  // dropped once
  std::fprintf(stderr, "[troupe rank %d] dropping the connection of %s: %s\n", opts_.rank,
               describe(r).c_str(), why.c_str());
  peer_gone(r, "its connection was dropped: it sent " + why, true, -1, failure_kind::dropped);
  std::lock_guard<std::mutex> g{mtx_};
  auto& p = at(r);
  if (p.in_socket) p.in_socket->close();  // its reader ends; the peer sees the end
  if (p.in_link) p.in_link->close();
}

}  // namespace troupe::detail
