#pragma once
// rank_runtime — the actor system of one rank and its work relay.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "actors/actors.hpp"

namespace troupe::detail {

class data_plane;

class rank_runtime {
 public:
  /// `job` names the world in the in-process directory; `threads` sizes the scheduler.
  rank_runtime(int rank, std::string job, std::size_t threads);
  ~rank_runtime();

  caf::actor_system& system() noexcept { return *sys_; }
  const relay_actor& relay() const noexcept { return relay_; }
  const std::string& job() const noexcept { return job_; }
  int rank() const noexcept { return rank_; }
  /// How this rank reaches ranks in other processes (set once by the world).
  const std::shared_ptr<data_plane>& plane() const noexcept { return plane_; }
  void set_plane(std::shared_ptr<data_plane> p) { plane_ = std::move(p); }
  /// A component attached to this rank under `key` (the device actor of each
  /// CUDA device): made by `make` on first use, released before the actor system.
  std::shared_ptr<void> attachment(const std::string& key,
                                   const std::function<std::shared_ptr<void>()>& make);
  /// Set when every rank of this process leaves with this one (a harness of
  /// in-process ranks ends them all once every rank's function returned):
  /// its group actors then end without telling each peer here, n - 1
  /// messages each, n^2 in all (about 16 million at 4,096 ranks).
  const std::shared_ptr<std::atomic<bool>>& leaving_together() const noexcept { return together_; }

 private:
  int rank_;
  std::string job_;
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  relay_actor relay_;
  std::shared_ptr<data_plane> plane_;
  std::mutex attach_mtx_;
  std::map<std::string, std::shared_ptr<void>> attached_;
  std::shared_ptr<std::atomic<bool>> together_ = std::make_shared<std::atomic<bool>>(false);
};

/// Spawns the relay (see actors/actors.hpp).
relay_actor spawn_work_relay(caf::actor_system& sys);

}  // namespace troupe::detail
