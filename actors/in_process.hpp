#pragma once
// in_process — the transport between ranks that live in one process.
//
// Ranks find each other through a directory keyed by strings such as
// "<job>/<group>/<rank>": the process is the in-process transport's network,
// and the directory is its name service (the job id comes from the store, so
// unrelated jobs in one process never meet). Messages are plain CAF messages
// between the group actors of different actor systems; payload tensors travel
// as shared handles and are never serialized or copied.

#include <chrono>
#include <string>
#include <vector>

#include "actors/actors.hpp"
#include "actors/transport.hpp"

namespace troupe::detail {

/// The process-wide name service of in-process ranks.
class in_process_directory {
 public:
  static in_process_directory& instance();
  void put(const std::string& key, const group_actor& actor);
  void erase(const std::string& key);
  /// Waits until `key` is present or `timeout` passes (then returns nullptr handle).
  group_actor find(const std::string& key, std::chrono::milliseconds timeout);

 private:
  in_process_directory() = default;
};

class in_process_transport final : public transport {
 public:
  in_process_transport(std::vector<group_actor> peers, std::vector<int> global_ranks)
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
