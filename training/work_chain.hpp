#pragma once
// Continuations whose waiting drives the operation they continue.
//
// A inline operation progresses in the thread that waits for it (or on the
// inline engine's 1 ms watchdog tick when nobody waits); work::then's wait drives
// the work it continues. and_then chains a continuation that issues a
// collective itself: waiting drives the first work, then the one the
// continuation issued.

#include <functional>

#include "troupe/work.hpp"

namespace troupe::detail {

/// A work that completes as the work `next` returns does; `next` runs once `w`
/// completed successfully (on the thread that completes it) and may issue a
/// collective. A failure of `w`, or what `next` throws, fails the result.
/// Waiting drives w, then next's work.
work and_then(const work& w, std::function<work(const work&)> next);

}  // namespace troupe::detail
