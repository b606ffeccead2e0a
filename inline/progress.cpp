// progress (progress.hpp): the ticker thread and the drivers.

#include "inline/progress.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "base/callback_pool.hpp"
#include "base/futex.hpp"
#include "base/sim_conductor.hpp"
#include "base/thread_name.hpp"
#include "inline/engine.hpp"

namespace troupe::detail {
namespace {

struct ticker_state {
  std::mutex mtx;
  std::vector<std::weak_ptr<inline_engine>> watched;  // engines with pending operations
  bool started = false;
  int driving = 0;  // engines driven on the pool now
  int max_driving = std::max(16, 2 * static_cast<int>(std::thread::hardware_concurrency()));
  std::atomic<std::uint32_t> word{0};  // bumped to wake the ticker
  std::atomic<bool> idle{false};       // the ticker sleeps without timeout
  std::atomic<std::int64_t> period_ms{1};
};

ticker_state& ticker() {
  static auto* t = new ticker_state;  // never destroyed: its thread may outlive main
  return *t;
}

void wake_ticker() {
  auto& t = ticker();
  t.word.fetch_add(1);
  futex_wake(t.word);
}

/// Drives `e` on a pool thread while continuations wait and no thread does.
void drive_on_pool(std::shared_ptr<inline_engine> e) {
  post_callback([e = std::move(e)] {
    for (;;) {
      e->drive_continued();
      e->progress_driven().store(false);
      // A continuation registered before the mark was cleared did not wake
      // the ticker (progress_wake saw this driver): look once more.
      if (!e->needs_driver() || e->progress_driven().exchange(true)) break;
    }
    {
      auto& t = ticker();
      std::lock_guard<std::mutex> g{t.mtx};
      --t.driving;
    }
    wake_ticker();  // another engine may wait for a driver, or this one again
  });
}

/// One round over the watched engines; false when none has anything pending.
bool tick() {
  auto& t = ticker();
  std::vector<std::shared_ptr<inline_engine>> live;
  {
    std::lock_guard<std::mutex> g{t.mtx};
    std::erase_if(t.watched, [&](const std::weak_ptr<inline_engine>& w) {
      auto e = w.lock();
      if (!e) return true;
      if (e->idle()) {
        // Leaves the list; a submit that raced with this check finds the
        // mark cleared and registers the engine again.
        e->progress_watched().store(false);
        if (e->idle() || e->progress_watched().exchange(true)) return true;
      }
      live.push_back(std::move(e));
      return false;
    });
  }
  for (auto& e : live) {
    if (!e->progress_driven().load() && e->needs_driver()) {
      std::unique_lock<std::mutex> g{t.mtx};
      if (t.driving < t.max_driving && !e->progress_driven().exchange(true)) {
        ++t.driving;
        g.unlock();
        drive_on_pool(e);
        continue;
      }
    }
    e->poke();
  }
  // The engines leave this thread here: one whose group went away meanwhile
  // is destroyed by this thread, outside the lock.
  return !live.empty();
}

void ticker_loop() {
  name_this_thread("trp-ticker");
  auto& t = ticker();
  for (;;) {
    const auto seen = t.word.load();
    if (tick()) {
      futex_wait(t.word, seen, std::chrono::milliseconds(t.period_ms.load()));
      continue;
    }
    // Nothing pending: sleep until an engine registers. A registration
    // bumps the word first, so one that came after `seen` ends the wait at
    // once, and one that sees `idle` wakes it.
    t.idle.store(true);
    futex_wait(t.word, seen, std::chrono::hours(1));
    t.idle.store(false);
  }
}

void watch(const std::shared_ptr<inline_engine>& e) {
  auto& t = ticker();
  {
    std::lock_guard<std::mutex> g{t.mtx};
    t.watched.push_back(e);
    if (!t.started) {
      t.started = true;
      std::thread(ticker_loop).detach();
    }
  }
  t.word.fetch_add(1);
  if (t.idle.load()) futex_wake(t.word);
}

}  // namespace

void progress_watch(const std::shared_ptr<inline_engine>& e) {
  // The ranks of a simulation move only on their turns (base/sim_conductor).
  if (sim_here()) return;
  if (!e->progress_watched().exchange(true)) watch(e);
}

void progress_wake(const std::shared_ptr<inline_engine>& e) {
  if (sim_here()) return;
  progress_watch(e);
  // A driver on the engine sees the continuation itself: waking the ticker
  // for every call of a chain would take the CPU from the driver.
  if (!e->progress_driven().load()) wake_ticker();
}

std::chrono::milliseconds set_tick_period(std::chrono::milliseconds period) {
  const auto before = std::chrono::milliseconds(ticker().period_ms.exchange(period.count()));
  wake_ticker();  // the next wait uses the new period
  return before;
}

}  // namespace troupe::detail
