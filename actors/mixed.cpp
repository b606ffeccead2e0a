#include "actors/mixed.hpp"

namespace troupe::detail {

std::string mixed_peers::send(int peer, envelope env,
                              std::chrono::steady_clock::time_point deadline,
                              const write_stall* stall) {
  auto p = static_cast<std::size_t>(peer);
  if (auto& a = local_->actors[p]) {
    caf::anon_send(a, data_atom::value, std::move(env));
    return {};
  }
  return dp_->send(global_ranks_[p], group_, env, deadline, stall);
}

std::string mixed_peers::send(int peer, p2p_envelope env,
                              std::chrono::steady_clock::time_point deadline) {
  auto p = static_cast<std::size_t>(peer);
  if (auto& a = local_->actors[p]) {
    caf::anon_send(a, msg_atom::value, std::move(env));
    return {};
  }
  return dp_->send(global_ranks_[p], group_, env, deadline);
}

std::string mixed_peers::describe_peer(int peer) const {
  auto p = static_cast<std::size_t>(peer);
  if (local_->actors[p])
    return "rank " + std::to_string(peer) + " (world rank " + std::to_string(global_ranks_[p]) +
           ")";
  return "rank " + std::to_string(peer) + " (" + dp_->describe(global_ranks_[p]) + ")";
}

void mixed_peers::reject(int peer, const std::string& why) {
  auto p = static_cast<std::size_t>(peer);
  if (!local_->actors[p]) dp_->reject(global_ranks_[p], why);
}

}  // namespace troupe::detail
