/// hash_store: an in-process store (a map under a mutex). A waiter sleeps on
/// a condition of its own, registered under the one key it misses next, so
/// that a write wakes only the waiters of its key: n ranks of a simulation
/// waiting for n keys each would otherwise wake n^2 times, each rereading
/// its keys.
#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <unordered_map>

#include "troupe/error.hpp"
#include "troupe/store.hpp"

namespace troupe {

struct hash_store::impl {
  struct waiter {
    std::condition_variable cv;
    bool woken = false;
  };
  std::mutex mu;
  std::map<std::string, bytes> data;
  std::unordered_map<std::string, std::vector<waiter*>> waiters;  // by the key they miss

  bool has(const std::string& key) const { return data.count(key) != 0; }

  /// With `mu` held: `key` was written; wakes its waiters.
  void wrote(const std::string& key) {
    auto it = waiters.find(key);
    if (it == waiters.end()) return;
    for (auto* w : it->second) {
      w->woken = true;
      w->cv.notify_one();  // under mu: the waiter (on its stack) cannot be gone yet
    }
    waiters.erase(it);
  }

  /// With `lock` held: waits until all `keys` exist; returns their values in order.
  std::vector<bytes> wait_for(std::unique_lock<std::mutex>& lock, const char* op,
                              const std::vector<std::string>& keys, duration timeout) {
    // Clamp so that now + timeout cannot overflow the steady clock.
    const auto limit = std::clamp(timeout, duration::zero(), duration(std::chrono::hours(876000)));
    const auto deadline = std::chrono::steady_clock::now() + limit;
    auto all_present = [&] {
      return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return has(k); });
    };
    std::size_t next = 0;  // keys before it were there when last looked at
    for (;;) {
      while (next < keys.size() && has(keys[next])) ++next;
      if (next == keys.size()) {
        if (all_present()) break;  // none deleted meanwhile
        next = 0;
        continue;
      }
      waiter w;
      auto& list = waiters[keys[next]];
      list.push_back(&w);
      const bool woken = w.cv.wait_until(lock, deadline, [&] { return w.woken; });
      if (!woken) {
        // Still registered (a write unregisters whom it wakes).
        if (auto it = waiters.find(keys[next]); it != waiters.end()) {
          std::erase(it->second, &w);
          if (it->second.empty()) waiters.erase(it);
        }
        if (all_present()) break;
        std::vector<std::string> missing;
        for (const auto& k : keys) {
          if (!has(k)) missing.push_back(k);
        }
        throw_timeout(op, missing, timeout);
      }
    }
    std::vector<bytes> values;
    values.reserve(keys.size());
    for (const auto& k : keys) values.push_back(data.at(k));
    return values;
  }
};

hash_store::hash_store(duration timeout) : store(timeout), impl_(std::make_unique<impl>()) {}

hash_store::~hash_store() = default;

void hash_store::set(const std::string& key, const bytes& value) {
  std::lock_guard lock(impl_->mu);
  impl_->data[key] = value;
  impl_->wrote(key);
}

bytes hash_store::get(const std::string& key) {
  std::unique_lock lock(impl_->mu);
  return std::move(impl_->wait_for(lock, "hash_store.get", {key}, timeout_).front());
}

std::int64_t hash_store::add(const std::string& key, std::int64_t delta) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->data.find(key);
  const auto value = add_to_counter("hash_store.add", key,
                                    it == impl_->data.end() ? nullptr : &it->second, delta);
  impl_->data[key] = to_bytes(std::to_string(value));
  impl_->wrote(key);
  return value;
}

bytes hash_store::compare_set(const std::string& key, const bytes& expected, const bytes& desired) {
  std::unique_lock lock(impl_->mu);
  auto it = impl_->data.find(key);
  if (it == impl_->data.end() && !expected.empty()) return expected;
  if (it != impl_->data.end() && it->second != expected) return it->second;
  impl_->data[key] = desired;
  impl_->wrote(key);
  return desired;
}

bool hash_store::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(impl_->mu);
  return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return impl_->has(k); });
}

void hash_store::wait(const std::vector<std::string>& keys, duration timeout) {
  std::unique_lock lock(impl_->mu);
  impl_->wait_for(lock, "hash_store.wait", keys, timeout);
}

bool hash_store::delete_key(const std::string& key) {
  std::lock_guard lock(impl_->mu);
  return impl_->data.erase(key) != 0;
}

std::int64_t hash_store::num_keys() {
  std::lock_guard lock(impl_->mu);
  return static_cast<std::int64_t>(impl_->data.size());
}

void hash_store::append(const std::string& key, const bytes& value) {
  std::lock_guard lock(impl_->mu);
  auto& v = impl_->data[key];
  v.insert(v.end(), value.begin(), value.end());
  impl_->wrote(key);
}

std::vector<bytes> hash_store::multi_get(const std::vector<std::string>& keys) {
  std::unique_lock lock(impl_->mu);
  return impl_->wait_for(lock, "hash_store.multi_get", keys, timeout_);
}

void hash_store::multi_set(const std::vector<std::string>& keys, const std::vector<bytes>& values) {
  check_multi_set("hash_store.multi_set", keys.size(), values.size());
  std::lock_guard lock(impl_->mu);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    impl_->data[keys[i]] = values[i];
    impl_->wrote(keys[i]);
  }
}

}  // namespace troupe
