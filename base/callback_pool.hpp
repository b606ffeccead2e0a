#pragma once
// callback_pool — threads that run completions' callbacks away from the
// thread that completed them.
//
// A work's callbacks (on_complete, then) run on the thread that completes
// it. When that thread is another rank's (a sender matching the receiver's
// receive), or the one reading a peer's frames, a callback that waits —
// for the next message from that rank or peer, for another future — would
// wait for the very thread it runs on. Such completions hand their
// callbacks here: a task never waits behind a busy thread (a new thread
// starts when none is idle), and threads idle for two seconds end.

#include <chrono>
#include <exception>
#include <functional>

#include "troupe/work.hpp"

namespace troupe::detail {

/// Runs `task` on one of the pool's threads (the pool lives until the
/// process ends). What `task` throws is reported on stderr.
void post_callback(std::function<void()> task);

/// Waits until no task is queued or running, at most `timeout`; returns
/// whether the pool is idle.
bool drain_callbacks(std::chrono::milliseconds timeout);

/// Completes (fails) `w` at once, its callbacks run on the pool
/// (base/work_state.hpp: complete_elsewhere).
void complete_in_pool(const work& w, tensor_list outputs, int source_rank = -1);
/// The same with one output (kept without a list: point-to-point calls).
void complete_in_pool(const work& w, tensor output, int source_rank = -1);
void fail_in_pool(const work& w, std::exception_ptr error);

}  // namespace troupe::detail
