#include "actors/mixed.hpp"

namespace troupe::detail {

void mixed_peers::send(int peer, envelope env) {
  auto p = static_cast<std::size_t>(peer);
  if (local_[p])
    caf::anon_send(local_[p], data_atom::value, std::move(env));
  else
    dp_->send(global_ranks_[p], group_, env);
}

void mixed_peers::send(int peer, p2p_envelope env) {
  auto p = static_cast<std::size_t>(peer);
  if (local_[p])
    caf::anon_send(local_[p], msg_atom::value, std::move(env));
  else
    dp_->send(global_ranks_[p], group_, env);
}

std::string mixed_peers::describe_peer(int peer) const {
  auto p = static_cast<std::size_t>(peer);
  if (local_[p])
    return "rank " + std::to_string(peer) + " (world rank " + std::to_string(global_ranks_[p]) +
           ")";
  return "rank " + std::to_string(peer) + " (" + dp_->describe(global_ranks_[p]) + ")";
}

void mixed_peers::reject(int peer, const std::string& why) {
  auto p = static_cast<std::size_t>(peer);
  if (!local_[p]) dp_->reject(global_ranks_[p], why);
}

std::vector<caf::actor_addr> mixed_peers::watch_list() const {
  std::vector<caf::actor_addr> r;
  for (auto& a : local_) r.push_back(a ? a.address() : caf::actor_addr{});
  return r;
}

}  // namespace troupe::detail
