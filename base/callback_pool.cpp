// callback_pool (callback_pool.hpp): tasks go to an idle thread, or to a new
// one when every thread is busy (a callback may block for long); a thread
// idle for two seconds ends, so the pool is empty while nothing completes
// elsewhere.

#include "base/callback_pool.hpp"
#include "base/thread_name.hpp"

#include "base/work_state.hpp"

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

namespace troupe::detail {
namespace {

struct pool_state {
  std::mutex mtx;
  std::condition_variable work_cv;  // a task was queued
  std::condition_variable idle_cv;  // the pool went idle
  std::deque<std::function<void()>> queue;
  int waiting = 0;  // threads blocked on work_cv with nothing to do
  int busy = 0;     // threads running a task
};

pool_state& pool() {
  static auto* p = new pool_state;  // never destroyed: its threads may outlive main
  return *p;
}

void report(const char* what) {
  std::fprintf(stderr, "[troupe] a callback run off the completing thread threw%s%s\n",
               what ? ": " : "", what ? what : "");
}

void worker() {
  name_this_thread("trp-callbacks");
  auto& p = pool();
  std::unique_lock<std::mutex> g{p.mtx};
  for (;;) {
    while (p.queue.empty()) {
      ++p.waiting;
      const bool got =
          p.work_cv.wait_for(g, std::chrono::seconds(2), [&] { return !p.queue.empty(); });
      --p.waiting;
      if (!got) return;  // idle long enough
    }
    auto task = std::move(p.queue.front());
    p.queue.pop_front();
    ++p.busy;
    g.unlock();
    try {
      task();
    } catch (const std::exception& e) {
      report(e.what());
    } catch (...) {
      report(nullptr);
    }
    task = nullptr;  // what it captured goes before the task counts as done
    g.lock();
    if (--p.busy == 0 && p.queue.empty()) p.idle_cv.notify_all();
  }
}

}  // namespace

void post_callback(std::function<void()> task) {
  auto& p = pool();
  std::lock_guard<std::mutex> g{p.mtx};
  p.queue.push_back(std::move(task));
  // Queued tasks beyond the threads waiting for one get a thread of their own.
  if (static_cast<int>(p.queue.size()) > p.waiting)
    std::thread(worker).detach();
  else
    p.work_cv.notify_one();
}

bool drain_callbacks(std::chrono::milliseconds timeout) {
  auto& p = pool();
  std::unique_lock<std::mutex> g{p.mtx};
  return p.idle_cv.wait_for(g, timeout, [&] { return p.queue.empty() && p.busy == 0; });
}

namespace {
/// The pool as a callback_runner, made once (not a std::function per call).
const callback_runner& on_pool() {
  static const callback_runner run = [](std::function<void()> f) { post_callback(std::move(f)); };
  return run;
}
}  // namespace

void complete_in_pool(const work& w, tensor_list outputs, int source_rank) {
  complete_elsewhere(w, std::move(outputs), source_rank, on_pool());
}

void complete_in_pool(const work& w, tensor output, int source_rank) {
  complete_one_elsewhere(w, std::move(output), source_rank, on_pool());
}

void fail_in_pool(const work& w, std::exception_ptr error) {
  fail_elsewhere(w, std::move(error), on_pool());
}

}  // namespace troupe::detail
