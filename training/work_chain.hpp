#pragma once
// Continuations whose waiting drives the operation they continue.
//
// A fabric operation progresses in the thread that waits for it (or on the
// fabric's 1 ms watchdog tick when nobody waits). work::then returns a work
// whose wait() only sleeps until the parent completes, so a hook that
// returns allreduce(...).then(...) would move at the watchdog's pace when the
// reducer waits for it. These give the new work a drive that drives the
// parent (and, for and_then, then the work the continuation issued).

#include <functional>

#include "troupe/work.hpp"

namespace troupe::detail {

/// w.then(fn), waited on by driving w.
work then_driving(const work& w, std::function<tensor_list(const work&)> fn);

/// A work that completes as the work `next` returns does; `next` runs once `w`
/// completed successfully (on the thread that completes it) and may issue a
/// collective. A failure of `w`, or what `next` throws, fails the result.
/// Waiting drives w, then next's work.
work and_then(const work& w, std::function<work(const work&)> next);

}  // namespace troupe::detail
