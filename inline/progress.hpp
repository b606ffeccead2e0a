#pragma once
// progress — the process's progress thread and drivers for inline engines.
//
// An operation nobody waits on must still complete: its deadline passes, its
// peers' data arrives, and continuations (on_complete, then, an actor's
// await, another library's future) must run as soon as a blocking wait would
// have returned. One thread per engine did that at the cost of a thread per
// group of every rank (a simulation of 1024 ranks held 2048 of them, each
// asleep). Instead, per process:
//  - one ticker thread looks after the engines that have pending operations
//    (an engine registers itself when an operation stays queued, and drops
//    out once its queue is empty): it pokes each every millisecond (one
//    non-blocking pass: works complete and deadlines pass while a thread in
//    wait() drives, or while nobody waits yet), and sleeps without timeout
//    while no engine has anything pending;
//  - when an engine's pending operations have continuations and no thread
//    waits, the ticker hands the engine to a driver on the callback pool,
//    which drives it as a waiting thread would (spin, poll, then sleep in the
//    medium until data arrives) until a waiting thread comes or no
//    continuation is left. At most max(16, 2 x CPUs) engines are driven at
//    once (a simulation of 1024 ranks chaining continuations would otherwise
//    hold 1024 drivers); the others are ticked until a driver is free.

#include <chrono>
#include <memory>

namespace troupe::detail {

class inline_engine;

/// `e` has an operation that stays queued: the ticker looks after it until
/// its queue is empty (idempotent).
void progress_watch(const std::shared_ptr<inline_engine>& e);

/// `e` may need a driver now (a continuation was registered, or a waiting
/// thread left pending operations behind): the ticker looks at once.
void progress_wake(const std::shared_ptr<inline_engine>& e);

/// Sets the ticker's period (1 ms) and returns the one before. For tests: a
/// period of hours shows that what they run does not wait for a tick.
std::chrono::milliseconds set_tick_period(std::chrono::milliseconds period);

}  // namespace troupe::detail
