#include "actors/in_process.hpp"

namespace troupe::detail {
void in_process_peers::send(int peer, envelope env) {
  caf::anon_send(peers_[static_cast<std::size_t>(peer)], data_atom::value, std::move(env));
}

void in_process_peers::send(int peer, p2p_envelope env) {
  caf::anon_send(peers_[static_cast<std::size_t>(peer)], msg_atom::value, std::move(env));
}

std::string in_process_peers::describe_peer(int peer) const {
  return "rank " + std::to_string(peer) + " (world rank " +
         std::to_string(global_ranks_[static_cast<std::size_t>(peer)]) + ")";
}

std::vector<caf::actor_addr> in_process_peers::watch_list() const {
  std::vector<caf::actor_addr> r;
  for (auto& p : peers_) r.push_back(p.address());
  return r;
}

}  // namespace troupe::detail
