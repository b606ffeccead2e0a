#pragma once
// in_process — the transport between ranks that live in one process.
//
// Ranks find each other's group actors through the process directory
// (base/process_directory.hpp): the process is the in-process transport's
// network, and the directory is its name service. Messages are plain CAF messages
// between the group actors of different actor systems; payload tensors travel
// as shared handles and are never serialized or copied.

#include <string>
#include <vector>

#include "actors/actor_peers.hpp"
#include "actors/actors.hpp"

namespace troupe::detail {

class in_process_peers final : public actor_peers {
 public:
  in_process_peers(std::vector<group_actor> peers, std::vector<int> global_ranks)
      : peers_(std::move(peers)), global_ranks_(std::move(global_ranks)) {}
  void send(int peer, envelope env) override;
  void send(int peer, p2p_envelope env) override;
  std::string describe_peer(int peer) const override;
  bool reads_after_send(int) const override { return true; }
  std::vector<caf::actor_addr> watch_list() const override;
  const std::vector<group_actor>& peers() const noexcept { return peers_; }

 private:
  std::vector<group_actor> peers_;
  std::vector<int> global_ranks_;
};

}  // namespace troupe::detail
