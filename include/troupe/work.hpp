#pragma once
/// troupe::work — the handle every collective and point-to-point call returns.
///
/// A work is the façade over the response promise that the group actor
/// fulfils: it completes exactly once, with the output tensors or with an
/// error. Blocking waits are for plain threads; code running inside a CAF
/// actor awaits the same result without blocking through
/// <troupe/caf_await.hpp>.

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "troupe/tensor.hpp"

namespace troupe {

namespace detail {
struct work_state;
}

class work {
 public:
  using duration = std::chrono::milliseconds;

  /// A work that is not attached to any operation (valid() == false).
  work() = default;

  /// Blocks until the operation finishes. Throws troupe::error when it failed:
  /// the message names the operation, the group, the sequence number and the cause.
  /// The operation itself is bounded by its timeout, so this never hangs forever.
  void wait() const;
  /// As wait(), but throws errc::timeout when `timeout` passes first (the
  /// operation keeps running; wait again or let it time out).
  void wait(duration timeout) const;
  /// Whether the operation finished (successfully or not).
  bool is_completed() const;
  /// Whether it finished without error.
  bool is_success() const;
  /// The error it failed with, or nullptr (also while still running).
  std::exception_ptr exception() const;
  /// Waits, then returns the output tensors (rethrows on failure).
  tensor_list result() const;
  /// For recv and recv_any_source: the rank that sent the message (-1 for
  /// other calls and while running).
  int source_rank() const;
  /// The group's sequence number of this operation (0 until the group actor assigned it).
  std::uint64_t sequence_number() const;
  /// "allreduce", "broadcast", ...
  std::string op_name() const;
  /// The group the operation runs on.
  std::string group_name() const;

  /// Chains a continuation like torch.futures.Future.then: `fn` runs once this work
  /// completes (on the thread that completes it, or right away if already done)
  /// and receives this work; the returned work completes with what `fn` returns,
  /// or fails with what it throws or with this work's error if `fn` rethrows it.
  work then(std::function<tensor_list(const work&)> fn) const;
  /// Registers a callback without creating a new work (runs exactly once, on
  /// the thread that completes the work or right away if already done). What
  /// it throws stays with it: it is reported on stderr and never reaches the
  /// call that completed or waits on this or any other work.
  void on_complete(std::function<void(const work&)> fn) const;

  bool valid() const noexcept { return static_cast<bool>(state_); }

  // -- for backends (including user-written ones) ----------------------------

  /// A pending work for operation `op` on group `group`; complete it with
  /// complete() or fail().
  static work make(std::string op, std::string group, std::uint64_t seq = 0);
  /// A work that already completed with `outputs`.
  static work completed(std::string op, std::string group, tensor_list outputs);
  /// A work that already failed with `error`.
  static work failed(std::string op, std::string group, std::exception_ptr error);
  /// Completes the work (first call wins; later calls are ignored).
  void complete(tensor_list outputs, int source_rank = -1) const;
  /// Fails the work with `error` (first call wins).
  void fail(std::exception_ptr error) const;
  /// Sets the sequence number (done by the group actor).
  void set_sequence_number(std::uint64_t seq) const;
  /// Completes when every work in `parts` completed; fails with the first failure.
  /// The outputs are the concatenation of the parts' outputs.
  static work when_all(std::string op, std::string group, std::vector<work> parts);

  /// Internal: a work over an existing shared state.
  static work attach(std::shared_ptr<detail::work_state> s) { return work{std::move(s)}; }
  /// Internal: the shared state (used by the actor runtime and interop header).
  const std::shared_ptr<detail::work_state>& state() const noexcept { return state_; }

 private:
  explicit work(std::shared_ptr<detail::work_state> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::work_state> state_;
};

}  // namespace troupe
