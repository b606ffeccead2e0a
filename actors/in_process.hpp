#pragma once
// in_process — the transport between ranks that live in one process.
//
// Ranks find each other's group actors in a roster each group shares in
// this process (group_roster, found through base/process_directory.hpp): the
// process is the in-process transport's network, and the roster its name
// service. Messages are plain CAF messages between the group actors of
// different actor systems; payload tensors travel as shared handles and are
// never serialized or copied.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actors/actor_peers.hpp"
#include "actors/actors.hpp"

namespace troupe::detail {

/// The group actors of one group's ranks that live in this process (a null
/// handle for a rank elsewhere) and their addresses, one copy shared by
/// all of them.
struct group_members {
  std::vector<group_actor> actors;
  std::vector<caf::actor_addr> addresses;
};
using members_ptr = std::shared_ptr<const group_members>;

/// Where the ranks of one group in this process meet while they set it up:
/// each puts its group actor and takes everyone's at once, one lock each.
/// (Looking each peer up in the process directory made n^2 lookups on its
/// one lock: most of the set-up time of 4,096 ranks in one process.)
class group_roster {
 public:
  /// A group of `size` ranks, `here` of them in this process.
  group_roster(int size, int here) : actors_(static_cast<std::size_t>(size)), here_(here) {}
  /// Puts group rank `rank`'s actor, then waits until `deadline` for every
  /// rank of the group in this process (`lives_here(r)`); returns them all,
  /// or null at the deadline with `missing` the first rank that never came.
  members_ptr meet(int rank, group_actor self, std::chrono::steady_clock::time_point deadline,
                   const std::function<bool(int)>& lives_here, int& missing);

 private:
  std::mutex mtx_;
  std::condition_variable all_came_;
  std::vector<group_actor> actors_;
  int here_;
  int came_ = 0;
  members_ptr members_;  // once every rank here came
};

class in_process_peers final : public actor_peers {
 public:
  in_process_peers(members_ptr peers, std::vector<int> global_ranks)
      : peers_(std::move(peers)), global_ranks_(std::move(global_ranks)) {}
  std::string send(int peer, envelope env, std::chrono::steady_clock::time_point deadline,
                   const write_stall* stall = nullptr) override;
  std::string send(int peer, p2p_envelope env,
                   std::chrono::steady_clock::time_point deadline) override;
  std::string describe_peer(int peer) const override;
  bool reads_after_send(int) const override { return true; }
  std::shared_ptr<const std::vector<caf::actor_addr>> watch_list() const override {
    return {peers_, &peers_->addresses};
  }

 private:
  members_ptr peers_;
  std::vector<int> global_ranks_;
};

}  // namespace troupe::detail
