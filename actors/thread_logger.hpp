#pragma once
// release_thread_logger — lets an actor system end on any thread.
//
// CAF 0.17 keeps, per thread, a strong reference to the logger of the last
// actor system that thread built or spawned an actor into, and an actor
// system's destructor waits until every reference to its logger is gone. A
// caller's thread that built a rank's system (or spawned into it) and went
// on would pin it: the world ending on another thread then waited forever.
// troupe logs nothing through CAF, so such threads let go at once.

#include <caf/logger.hpp>

namespace troupe::detail {

inline void release_thread_logger() noexcept {
  caf::logger::set_current_actor_system(nullptr);
}

/// Lets go when the scope ends; declared before a caf::scoped_actor, after it.
struct thread_logger_release {
  thread_logger_release() = default;
  thread_logger_release(const thread_logger_release&) = delete;
  thread_logger_release& operator=(const thread_logger_release&) = delete;
  ~thread_logger_release() { release_thread_logger(); }
};

}  // namespace troupe::detail
