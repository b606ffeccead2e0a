/// hash_store: an in-process store (a map under a mutex; waiters use a condition variable).
#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>

#include "troupe/error.hpp"
#include "troupe/store.hpp"

namespace troupe {

struct hash_store::impl {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, bytes> data;

  bool has(const std::string& key) const { return data.count(key) != 0; }

  /// With `lock` held: waits until all `keys` exist; returns their values in order.
  std::vector<bytes> wait_for(std::unique_lock<std::mutex>& lock, const char* op,
                              const std::vector<std::string>& keys, duration timeout) {
    // Clamp so that now + timeout cannot overflow the steady clock.
    const auto limit = std::clamp(timeout, duration::zero(), duration(std::chrono::hours(876000)));
    const auto deadline = std::chrono::steady_clock::now() + limit;
    auto all_present = [&] {
      return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return has(k); });
    };
    if (!cv.wait_until(lock, deadline, all_present)) {
      std::vector<std::string> missing;
      for (const auto& k : keys) {
        if (!has(k)) missing.push_back(k);
      }
      throw_timeout(op, missing, timeout);
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
  {
    std::lock_guard lock(impl_->mu);
    impl_->data[key] = value;
  }
  impl_->cv.notify_all();
}

bytes hash_store::get(const std::string& key) {
  std::unique_lock lock(impl_->mu);
  return std::move(impl_->wait_for(lock, "hash_store.get", {key}, timeout_).front());
}

std::int64_t hash_store::add(const std::string& key, std::int64_t delta) {
  std::int64_t value = 0;
  {
    std::lock_guard lock(impl_->mu);
    auto it = impl_->data.find(key);
    value = add_to_counter("hash_store.add", key, it == impl_->data.end() ? nullptr : &it->second,
                           delta);
    impl_->data[key] = to_bytes(std::to_string(value));
  }
  impl_->cv.notify_all();
  return value;
}

bytes hash_store::compare_set(const std::string& key, const bytes& expected, const bytes& desired) {
  std::unique_lock lock(impl_->mu);
  auto it = impl_->data.find(key);
  if (it == impl_->data.end() && !expected.empty()) return expected;
  if (it != impl_->data.end() && it->second != expected) return it->second;
  impl_->data[key] = desired;
  lock.unlock();
  impl_->cv.notify_all();
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
  {
    std::lock_guard lock(impl_->mu);
    auto& v = impl_->data[key];
    v.insert(v.end(), value.begin(), value.end());
  }
  impl_->cv.notify_all();
}

std::vector<bytes> hash_store::multi_get(const std::vector<std::string>& keys) {
  std::unique_lock lock(impl_->mu);
  return impl_->wait_for(lock, "hash_store.multi_get", keys, timeout_);
}

void hash_store::multi_set(const std::vector<std::string>& keys, const std::vector<bytes>& values) {
  check_multi_set("hash_store.multi_set", keys.size(), values.size());
  {
    std::lock_guard lock(impl_->mu);
    for (std::size_t i = 0; i < keys.size(); ++i) impl_->data[keys[i]] = values[i];
  }
  impl_->cv.notify_all();
}

}  // namespace troupe
