#pragma once
// work_driver — what moves a work's operation in the threads that wait for it.

#include <chrono>

namespace troupe::detail {

struct work_state;

/// What moves a work's operation in the threads that wait for it (an inline
/// engine, a receive's plan of what to read, the work a continuation
/// continues): drive(s, until) advances it until `s` finished or `until`
/// passed; poke() makes one non-blocking pass (true: it moved something);
/// continued() hears that a continuation was registered while the work is
/// pending (nobody may ever wait for it, so a progress thread should drive
/// it). One object per engine or plan, shared by its works: setting it on a
/// work is one count, not three callables.
class work_driver {
 public:
  virtual ~work_driver() = default;
  virtual void drive(work_state& s, std::chrono::steady_clock::time_point until) const = 0;
  virtual bool poke() const { return false; }
  virtual void continued() const {}
};

}  // namespace troupe::detail
