#pragma once
// The threads that complete torch futures for troupe works.
//
// troupe runs on_complete callbacks on the thread that completes a work: a
// waiting thread, a reader thread or the inline engine's progress thread. Torch
// runs a future's callbacks in markCompleted, and those may block on other
// futures (PowerSGD's Python hook waits on an allreduce inside a then()
// callback) or issue new collectives. Run on troupe's threads, such a
// callback could stall the very progress it waits for. So the bridge hands
// every completion to this pool: a task never waits behind a busy thread
// (a new thread starts when none is idle, up to a cap), idle threads stay
// for the next completions.

#include <chrono>
#include <functional>

namespace troupe_torch::detail {

/// Runs `task` on one of the pool's threads (the pool lives until the
/// process ends). What `task` throws is reported on stderr.
void post_callback(std::function<void()> task);

/// Waits until no task is queued or running, at most `timeout`; returns
/// whether the pool is idle. Python calls it at exit: a task that drops
/// the last reference to a tensor with a Python object needs the GIL, and
/// a thread that asks for it while the interpreter finalizes is ended
/// (torch 1.13 on Python 3.11: std::terminate).
bool drain_callbacks(std::chrono::milliseconds timeout);

/// Runs `f` with Python's GIL released when the calling thread holds it
/// (the Python module installs how: set_gil_releaser); else just runs it.
/// Tearing a troupe group down joins troupe's threads, and one of them may
/// be dropping a tensor with a Python object, which takes the GIL.
void without_gil(const std::function<void()>& f);
void set_gil_releaser(std::function<void(const std::function<void()>&)> releaser);

}  // namespace troupe_torch::detail
