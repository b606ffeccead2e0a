#pragma once
// The NCCL state of one group of the "nccl" backend: its communicators, set
// up lazily and without blocking, and the launching of each call's plan
// (backends/nccl_plan.hpp) in the rank's device actor.
//
// Design
//   communicators  One NCCL communicator per group, on the device of the
//                  group's first call (later calls on another device are
//                  refused, naming both), created lazily at that first call.
//                  send/recv between two ranks run on a communicator of just
//                  that pair (key "lo:hi"), so point to point never needs the
//                  rest of the group. The communicator's rank 0 (group rank 0,
//                  or the pair's lower rank) makes the unique id and sets it
//                  in the group's store under "nccl/uid/KEY" (KEY: "0" for the
//                  group's communicator, numbered as ProcessGroupNCCL numbers
//                  its communicators, "lo:hi" for a pair's); the others wait
//                  for it in the calling thread, within the group's timeout.
//   device actor   Every NCCL call and every kernel runs in a job of the
//                  rank's device actor, on its stream, in issue order. The
//                  caller's thread validates, allocates scratch memory and
//                  builds a plan (kernels before, one NCCL group, kernels
//                  after); nothing else.
//   set-up         A job creates the communicator with ncclCommInitRankConfig
//                  in non-blocking mode (config.blocking = 0), which returns
//                  at once. Until NCCL reports it ready, the calls on it are
//                  held here in issue order, so the device actor never waits
//                  for a peer: a timer actor submits a probe job every
//                  millisecond that polls ncclCommGetAsyncError; when the
//                  state leaves ncclInProgress the probe submits the held
//                  calls, on an error or past the group's timeout it fails
//                  the group.
//   launching      A non-blocking communicator launches in the background
//                  (ncclGroupEnd returns ncclInProgress). Each job issues its
//                  NCCL calls in one group and polls ncclCommGetAsyncError
//                  until the launch is done before it enqueues anything else,
//                  as NCCL requires; so the stream runs the jobs in order.
//                  That takes microseconds, except for a first call that
//                  connects new peers (it waits for them there), and is
//                  bounded by the job's timeout and by abort().
//   failures       Every NCCL result is checked ("OP: cuda:N: ncclXxx failed:
//                  STRING (LAST ERROR)"), and pending jobs poll the
//                  communicator's asynchronous error. The first failure or
//                  abort() breaks the group: held calls (and, for abort, all
//                  pending ones) fail, the communicators are aborted with
//                  ncclCommAbort in the device actor, and every later call
//                  fails at once naming the group and that first failure. The
//                  destructor destroys idle communicators (ncclCommDestroy) and
//                  aborts the others, so it never waits for a peer.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/device_actor.hpp"
#include "backends/nccl_plan.hpp"
#include "backends/nccl_runner.hpp"
#include "troupe/backend.hpp"

namespace troupe::detail::nccl {

/// One NCCL communicator of the group (backends/nccl_group.cpp).
struct communicator;

/// The first failure that broke the group.
struct failure {
  errc code;
  std::string why;
};

/// The NCCL state of one group: shared by the backend and its jobs, which
/// may outlive it in the device actor. The backend sees it as its plan_runner.
class nccl_group : public plan_runner, public std::enable_shared_from_this<nccl_group> {
 public:
  explicit nccl_group(const backend_context& ctx);

  // -- the caller's side -------------------------------------------------------------

  /// Checks that every tensor is on the group's device (the first call picks it); returns it.
  int bind(const char* op, const tensor_list& ts) override;

  /// The group's device for a call without tensors (barrier): rank % devices until bound.
  int bind_default(const char* op) override { return bind(op, {}); }

  /// Issues `p` on the group's communicator (peer == whole_group) or on the
  /// pair with group rank `peer`. The work completes with `outputs` (and,
  /// for recv, `source` as its source rank).
  work issue(const char* op, int peer, plan p, tensor_list outputs, timeout_t t,
             int source = -1) override;

  std::uint64_t sequence() const override;

  /// Fails every pending call and aborts the communicators (ncclCommAbort).
  void abort(const std::string& reason) override;

  /// The backend goes away: fails what is pending, destroys idle
  /// communicators and aborts the others, waiting (bounded) for the device actor.
  void shutdown() override;

 private:
  static rank_runtime& runtime_of(const backend_context& ctx);

  /// rank % devices, as ProcessGroupNCCL guesses a device for calls without tensors.
  int guess_device(const char* op) const;

  void use_device(int device);

  /// The communicator for `peer`, created (and its set-up started) on first
  /// use. Its set-up (unique id, init) is bounded by the group's timeout.
  std::shared_ptr<communicator> communicator_for(const char* op, int peer);

  /// A new communicator's description (under mtx_).
  std::shared_ptr<communicator> describe(const char* op, int peer, timeout_t t) const;

  /// Waits (in the caller's thread) for the publisher's unique id in the store.
  bytes fetch_uid(const char* op, const communicator& c, timeout_t t) const;

  /// Polls the communicator's set-up every init_poll_interval until it settles.
  void watch_init(const std::shared_ptr<communicator>& c);

  void submit_probe(const std::shared_ptr<communicator>& c);

  /// A job of the backend itself (set-up, probes, teardown): a failure breaks the group.
  gpu::device_job internal_job(const char* op, std::function<void()> fn);

  /// The job of one call (see the header comment for each step's role).
  gpu::device_job call_job(const char* op, std::shared_ptr<communicator> c, std::shared_ptr<plan> p,
                           timeout_t t);

  /// recv: the device actor completes the inner work; `user` gets the sender's rank too.
  work forwarded(const work& user, const char* op, int source) const;

  /// Numbers the call and hands it to the device actor, or holds it while its
  /// communicator is set up. False when the group is broken.
  bool enqueue(communicator& c, gpu::device_job job, const work& user);

  /// Remembers pending works so that abort() and the destructor can fail them.
  void track(const work& w);

  // -- the device actor's side ---------------------------------------------------------

  /// Set-up job: makes (rank 0) or takes the unique id and starts a
  /// non-blocking ncclCommInitRankConfig.
  void start(communicator& c, const std::optional<bytes>& uid);

  /// Probe job: once the set-up left ncclInProgress, opens the communicator;
  /// throws (breaking the group) when it failed or ran past its timeout.
  void probe(communicator& c);

  /// Submits the calls held during the set-up, in order, with what is left of their timeouts.
  void open(communicator& c);

  /// Call job: issues the plan on the stream.
  void launch(const char* op, communicator& c, const plan& p, gpu::stream_t s, timeout_t t);

  /// Health check of a pending call: the communicator's asynchronous error, or the group's.
  std::string health(const char* op, const communicator& c) const;

  std::string async_error(const char* op, const communicator& c) const;

  /// A job failed: the group is broken and its communicators are aborted.
  void failed(errc code, const std::string& why);

  /// Teardown job: destroys idle, healthy communicators and aborts the others.
  void teardown(bool force);

  // -- both sides ------------------------------------------------------------------------

  /// Breaks the group with its first failure: held calls fail (and pending
  /// ones, with `fail_pending`). Returns whether any call was unfinished.
  bool mark_broken(errc code, const std::string& why, bool fail_pending);

  /// Submits the teardown job (a failure already aborted every communicator);
  /// its work completes once it ran.
  work submit_teardown(bool force);

  error refusal(const char* op) const;
  error refusal_locked(const char* op) const;

  std::vector<std::shared_ptr<communicator>> communicators() const;

  rank_runtime& rt_;
  std::shared_ptr<store> store_;
  int rank_;
  int size_;
  std::string group_;
  timeout_t timeout_;
  std::mutex create_mtx_;   // one communicator set-up at a time (may wait on the store)
  mutable std::mutex mtx_;  // everything below
  int device_ = -1;         // the group's device, once bound
  std::shared_ptr<gpu::device_queue> queue_;
  std::map<std::string, std::shared_ptr<communicator>> comms_;
  std::vector<work> pending_;
  std::uint64_t issued_ = 0;
  std::optional<failure> broken_;
  std::atomic<bool> stopping_{false};  // broken_ is set (read without the lock)
  std::atomic<std::thread::id> actor_thread_{};
};

}  // namespace troupe::detail::nccl
