#include "base/process_directory.hpp"

#include <condition_variable>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace troupe::detail {
namespace {

// A waiter sleeps on a condition of its own, registered under its key: a put
// wakes only the waiters of its key (the n ranks of a group each look up n
// peers while they publish theirs).
struct waiter {
  std::condition_variable cv;
  bool woken = false;
};

struct entries {
  std::mutex mtx;
  std::unordered_map<std::string, std::any> map;
  std::unordered_map<std::string, std::vector<waiter*>> waiters;

  /// With mtx held: `key` was put; wakes its waiters.
  void wake(const std::string& key) {
    auto it = waiters.find(key);
    if (it == waiters.end()) return;
    for (auto* w : it->second) {
      w->woken = true;
      w->cv.notify_one();  // under mtx: the waiter (on its stack) cannot be gone yet
    }
    waiters.erase(it);
  }
};

entries& the_entries() {
  static entries e;
  return e;
}

}  // namespace

process_directory& process_directory::instance() {
  static process_directory d;
  return d;
}

void process_directory::put(const std::string& key, std::any value) {
  auto& e = the_entries();
  std::lock_guard<std::mutex> g{e.mtx};
  e.map[key] = std::move(value);
  e.wake(key);
}

void process_directory::erase(const std::string& key,
                              const std::function<bool(const std::any&)>& only_if) {
  auto& e = the_entries();
  std::lock_guard<std::mutex> g{e.mtx};
  auto i = e.map.find(key);
  if (i != e.map.end() && (!only_if || only_if(i->second))) e.map.erase(i);
}

std::any process_directory::find(const std::string& key) {
  auto& e = the_entries();
  std::lock_guard<std::mutex> g{e.mtx};
  auto i = e.map.find(key);
  return i == e.map.end() ? std::any{} : i->second;
}

std::any process_directory::find_or_put(const std::string& key,
                                        const std::function<std::any()>& make,
                                        const std::function<bool(const std::any&)>& stale) {
  auto& e = the_entries();
  std::lock_guard<std::mutex> g{e.mtx};
  auto i = e.map.find(key);
  if (i != e.map.end() && !(stale && stale(i->second))) return i->second;
  auto& v = e.map[key];
  v = make();
  e.wake(key);
  return v;
}

std::any process_directory::wait_for(const std::string& key, std::chrono::milliseconds timeout) {
  auto& e = the_entries();
  std::unique_lock<std::mutex> g{e.mtx};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (auto i = e.map.find(key); i != e.map.end()) return i->second;
    waiter w;
    e.waiters[key].push_back(&w);
    if (!w.cv.wait_until(g, deadline, [&] { return w.woken; })) {
      if (auto it = e.waiters.find(key); it != e.waiters.end()) {
        std::erase(it->second, &w);
        if (it->second.empty()) e.waiters.erase(it);
      }
      auto i = e.map.find(key);
      return i == e.map.end() ? std::any{} : i->second;
    }
  }
}

}  // namespace troupe::detail
