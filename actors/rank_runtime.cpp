#include "actors/rank_runtime.hpp"

#include "actors/thread_logger.hpp"
#include "transport/data_plane.hpp"

namespace troupe::detail {

rank_runtime::rank_runtime(int rank, std::string job, std::size_t threads)
    : rank_(rank), job_(std::move(job)) {
  // The default work-stealing policy naps in 50 µs sleeps; the sharing
  // policy's threads are woken when work is queued.
  cfg_.set("scheduler.policy", caf::atom("sharing"));
  cfg_.set("scheduler.max-threads", threads);
  sys_ = std::make_unique<caf::actor_system>(cfg_);
  // CAF 0.17 gives every actor system a printer actor (for aout) on a thread
  // of its own; troupe never prints through it, and a simulation of 1024
  // ranks would hold 1024 such threads asleep.
  caf::anon_send_exit(sys_->scheduler().printer(), caf::exit_reason::kill);
  relay_ = spawn_work_relay(*sys_);
  release_thread_logger();  // the world may end on another thread
}

std::shared_ptr<void> rank_runtime::attachment(const std::string& key,
                                               const std::function<std::shared_ptr<void>()>& make) {
  std::lock_guard<std::mutex> g{attach_mtx_};
  auto& slot = attached_[key];
  if (!slot) slot = make();
  return slot;
}

rank_runtime::~rank_runtime() {
  {
    std::lock_guard<std::mutex> g{attach_mtx_};
    attached_.clear();  // device actors stop (their streams drain) before the system goes
  }
  // Closed here, on the thread that ends the world: a reader thread may
  // still hold the plane for a moment, and must not be the one to close it.
  if (plane_) plane_->close();  // says goodbye, closes connections, joins the readers
  plane_.reset();
  caf::anon_send_exit(relay_, caf::exit_reason::user_shutdown);
  relay_ = nullptr;
  sys_.reset();  // waits for every actor of this rank to terminate
}

}  // namespace troupe::detail
