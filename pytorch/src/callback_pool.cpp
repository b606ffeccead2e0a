// The pool that completes torch futures (see callback_pool.hpp).

#include "callback_pool.hpp"

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

namespace troupe_torch::detail {
namespace {

class callback_pool {
 public:
  bool drain(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> g{mtx_};
    return drained_.wait_for(g, timeout, [this] { return tasks_.empty() && running_ == 0; });
  }

  void post(std::function<void()> task) {
    std::unique_lock<std::mutex> g{mtx_};
    tasks_.push_back(std::move(task));
    if (idle_ > pending_wakeups_) {
      ++pending_wakeups_;
      cv_.notify_one();
    } else if (threads_ < max_threads) {
      ++threads_;
      std::thread([this] { run(); }).detach();
    }
    // else: every thread is busy and the cap is reached; the task waits.
  }

 private:
  static constexpr int max_threads = 64;

  void run() {
    std::unique_lock<std::mutex> g{mtx_};
    for (;;) {
      if (tasks_.empty()) {
        ++idle_;
        cv_.wait(g, [this] { return !tasks_.empty(); });
        --idle_;
        if (pending_wakeups_ > 0) --pending_wakeups_;
        continue;
      }
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      ++running_;
      g.unlock();
      try {
        task();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "troupe_torch: a future's completion threw: %s\n", e.what());
      } catch (...) {
        std::fprintf(stderr, "troupe_torch: a future's completion threw\n");
      }
      task = nullptr;  // what it holds goes before the pool counts it done
      g.lock();
      if (--running_ == 0 && tasks_.empty()) drained_.notify_all();
    }
  }

  std::mutex mtx_;
  std::condition_variable cv_;
  std::condition_variable drained_;
  std::deque<std::function<void()>> tasks_;
  int threads_ = 0;
  int idle_ = 0;
  int running_ = 0;
  int pending_wakeups_ = 0;  // notified idle threads that have not woken yet
};

callback_pool& the_pool() {
  // Never destroyed: its threads may still run while the process exits.
  static auto* pool = new callback_pool;
  return *pool;
}

}  // namespace

void post_callback(std::function<void()> task) {
  the_pool().post(std::move(task));
}

bool drain_callbacks(std::chrono::milliseconds timeout) {
  return the_pool().drain(timeout);
}

namespace {
std::mutex releaser_mtx;
std::function<void(const std::function<void()>&)> releaser;
}  // namespace

void set_gil_releaser(std::function<void(const std::function<void()>&)> r) {
  std::lock_guard<std::mutex> g{releaser_mtx};
  releaser = std::move(r);
}

void without_gil(const std::function<void()>& f) {
  std::function<void(const std::function<void()>&)> r;
  {
    std::lock_guard<std::mutex> g{releaser_mtx};
    r = releaser;
  }
  if (r)
    r(f);
  else
    f();
}

}  // namespace troupe_torch::detail
