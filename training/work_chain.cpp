#include "training/work_chain.hpp"

#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "base/work_state.hpp"

namespace troupe::detail {

namespace {

using clock = std::chrono::steady_clock;

/// The operation a continuation's wait drives: its parent, then the work
/// the continuation issued (and_then).
struct drive_target {
  std::mutex mtx;
  std::shared_ptr<work_state> current;

  std::shared_ptr<work_state> get() {
    std::lock_guard<std::mutex> g{mtx};
    return current;
  }
  void set(std::shared_ptr<work_state> s) {
    std::lock_guard<std::mutex> g{mtx};
    current = std::move(s);
  }
};

/// Drives whatever `target` names until the work it drives finished.
struct chain_driver final : work_driver {
  explicit chain_driver(std::shared_ptr<drive_target> t) : target(std::move(t)) {}
  void drive(work_state& self, clock::time_point until) const override {
    std::shared_ptr<work_state> last;
    while (!self.finished.load(std::memory_order_acquire) && clock::now() < until) {
      auto cur = target->get();
      if (!cur || !cur->driver) return;  // an actor operation: wait() sleeps until it is done
      if (cur != last) {
        cur->driver->drive(*cur, until);
        last = cur;
      } else if (cur->finished.load(std::memory_order_acquire)) {
        // Done; its continuation runs on another thread and may issue the next work.
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      } else {
        return;  // stopped before `until` without finishing: let wait() decide
      }
    }
  }
  bool poke() const override {
    auto cur = target->get();
    return cur && cur->driver && cur->driver->poke();
  }
  std::shared_ptr<drive_target> target;
};

}  // namespace

work and_then(const work& w, std::function<work(const work&)> next) {
  auto result = work::make(w.op_name() + ".and_then", w.group_name());
  auto target = std::make_shared<drive_target>();
  target->current = w.state();
  result.state()->driver = std::make_shared<chain_driver>(target);
  w.on_complete([result, target, next = std::move(next)](const work& done) {
    if (!done.is_success()) {
      result.fail(done.exception());
      return;
    }
    try {
      auto inner = next(done);
      target->set(inner.state());
      inner.on_complete([result](const work& in) {
        if (in.is_success())
          result.complete(in.result());
        else
          result.fail(in.exception());
      });
    } catch (...) {
      result.fail(std::current_exception());
    }
  });
  return result;
}

}  // namespace troupe::detail
