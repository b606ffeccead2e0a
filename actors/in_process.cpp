#include "actors/in_process.hpp"

namespace troupe::detail {
members_ptr group_roster::meet(int rank, group_actor self,
                               std::chrono::steady_clock::time_point deadline,
                               const std::function<bool(int)>& lives_here, int& missing) {
  std::unique_lock<std::mutex> g{mtx_};
  actors_[static_cast<std::size_t>(rank)] = std::move(self);
  if (++came_ == here_) {
    auto m = std::make_shared<group_members>();
    m->actors = actors_;
    for (auto& a : m->actors) m->addresses.push_back(a ? a.address() : caf::actor_addr{});
    members_ = std::move(m);
    all_came_.notify_all();
  }
  if (all_came_.wait_until(g, deadline, [&] { return members_ != nullptr; })) return members_;
  missing = -1;
  for (std::size_t r = 0; r < actors_.size() && missing < 0; ++r)
    if (!actors_[r] && lives_here(static_cast<int>(r))) missing = static_cast<int>(r);
  return nullptr;
}

std::string in_process_peers::send(int peer, envelope env, std::chrono::steady_clock::time_point,
                                   const write_stall*) {
  caf::anon_send(peers_->actors[static_cast<std::size_t>(peer)], data_atom::value, std::move(env));
  return {};
}

std::string in_process_peers::send(int peer, p2p_envelope env,
                                   std::chrono::steady_clock::time_point) {
  caf::anon_send(peers_->actors[static_cast<std::size_t>(peer)], msg_atom::value, std::move(env));
  return {};
}

std::string in_process_peers::describe_peer(int peer) const {
  return "rank " + std::to_string(peer) + " (world rank " +
         std::to_string(global_ranks_[static_cast<std::size_t>(peer)]) + ")";
}

}  // namespace troupe::detail
