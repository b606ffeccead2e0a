#pragma once
// actor_peers — how a group actor's messages reach the group actors of its
// peers: in this process handed over by reference (zero copy:
// in_process_peers), to other processes as frames of the data plane
// (mixed_peers). Not a transport: the bytes between processes go through
// the data plane's links (transport/link.hpp).

#include <memory>
#include <string>
#include <vector>

#include <caf/actor_addr.hpp>

#include "base/call.hpp"
#include "base/write_stall.hpp"

namespace troupe::detail {

class actor_peers {
 public:
  virtual ~actor_peers() = default;
  /// Delivers collective data to group rank `peer`; a peer in another
  /// process that takes nothing until `deadline` (its call's) is given up on
  /// (and failed): "", or why. A write to it blocked long first runs
  /// `stall` (base/write_stall.hpp), where given.
  virtual std::string send(int peer, envelope env, std::chrono::steady_clock::time_point deadline,
                           const write_stall* stall = nullptr) = 0;
  /// Delivers a point-to-point message to group rank `peer`: "", or why it
  /// could not (a peer in another process that is gone, or took nothing
  /// until `deadline`, the send's).
  virtual std::string send(int peer, p2p_envelope env,
                           std::chrono::steady_clock::time_point deadline) = 0;
  /// Whether a payload sent to `peer` is still read after send() returned (so
  /// the sender must hand over a private copy of a buffer it does not own).
  virtual bool reads_after_send(int peer) const = 0;
  /// "rank 2 (world rank 5)" — how errors name a peer.
  virtual std::string describe_peer(int peer) const = 0;
  /// Actors whose death means the peer of that index is gone (monitored by the
  /// group actor; empty entries are not watched). One list, shared by the
  /// group's ranks in this process.
  virtual std::shared_ptr<const std::vector<caf::actor_addr>> watch_list() const = 0;
  /// Whether group rank `peer` lives in another process (its messages are
  /// then held to the bounds of transport/frame.hpp).
  virtual bool in_other_process(int /*peer*/) const { return false; }
  /// Fails group rank `peer` as if its process died, naming `why` (it sent
  /// what the group may not hold); only peers in other processes.
  virtual void reject(int /*peer*/, const std::string& /*why*/) {}
};

}  // namespace troupe::detail
