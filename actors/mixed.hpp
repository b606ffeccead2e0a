#pragma once
// mixed — the transport of a group whose ranks live in several processes:
// peers in this process get CAF messages (zero copy, as in_process), peers
// elsewhere get frames through the data plane.

#include <memory>
#include <string>
#include <vector>

#include "actors/actor_peers.hpp"
#include "actors/actors.hpp"
#include "actors/in_process.hpp"
#include "transport/data_plane.hpp"

namespace troupe::detail {

class mixed_peers final : public actor_peers {
 public:
  /// `local->actors[r]` is the group actor of group rank r when it lives in
  /// this process, a null handle otherwise.
  mixed_peers(members_ptr local, std::vector<int> global_ranks, std::shared_ptr<data_plane> dp,
              std::string group)
      : local_(std::move(local)),
        global_ranks_(std::move(global_ranks)),
        dp_(std::move(dp)),
        group_(std::move(group)) {}
  std::string send(int peer, envelope env, std::chrono::steady_clock::time_point deadline,
                   const write_stall* stall = nullptr) override;
  std::string send(int peer, p2p_envelope env,
                   std::chrono::steady_clock::time_point deadline) override;
  std::string describe_peer(int peer) const override;
  /// Local peers read the shared payload later; the data plane writes it out
  /// before send() returns.
  bool reads_after_send(int peer) const override {
    return static_cast<bool>(local_->actors[static_cast<std::size_t>(peer)]);
  }
  std::shared_ptr<const std::vector<caf::actor_addr>> watch_list() const override {
    return {local_, &local_->addresses};
  }
  bool in_other_process(int peer) const override {
    return !local_->actors[static_cast<std::size_t>(peer)];
  }
  void reject(int peer, const std::string& why) override;

 private:
  members_ptr local_;
  std::vector<int> global_ranks_;
  std::shared_ptr<data_plane> dp_;
  std::string group_;
};

}  // namespace troupe::detail
