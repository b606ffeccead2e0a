// watchful_store: a store whose waits look for gone members
// (store/watchful_store.hpp).

#include "store/watchful_store.hpp"

#include <algorithm>

#include "troupe/error.hpp"

namespace troupe::detail {

namespace {

constexpr auto slice = std::chrono::milliseconds(100);

}  // namespace

watchful_store::watchful_store(std::shared_ptr<store> inner, std::function<void()> check)
    : store(inner->timeout()), inner_(std::move(inner)), check_(std::move(check)) {}

void watchful_store::look() {
  {
    std::lock_guard<std::mutex> g{mtx_};
    const auto now = std::chrono::steady_clock::now();
    if (now < next_look_) return;
    next_look_ = now + slice;
  }
  check_();
}

void watchful_store::wait_for(const char* op, const std::vector<std::string>& keys,
                              duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<duration>(deadline - std::chrono::steady_clock::now());
    try {
      inner_->wait(keys, std::clamp(left, duration(0), duration(slice)));
      return;
    } catch (const error& e) {
      if (e.code() != errc::timeout) throw;
    }
    look();
    if (std::chrono::steady_clock::now() < deadline) continue;
    std::vector<std::string> missing;
    for (const auto& k : keys)
      if (!inner_->check({k})) missing.push_back(k);
    if (missing.empty()) return;
    throw_timeout(op, missing, timeout);
  }
}

void watchful_store::set(const std::string& key, const bytes& value) {
  inner_->set(key, value);
}

bytes watchful_store::get(const std::string& key) {
  wait_for("store.get", {key}, timeout_);
  return inner_->get(key);
}

std::int64_t watchful_store::add(const std::string& key, std::int64_t delta) {
  look();  // polls (store_based_barrier) come through here
  return inner_->add(key, delta);
}

bytes watchful_store::compare_set(const std::string& key, const bytes& expected,
                                  const bytes& desired) {
  return inner_->compare_set(key, expected, desired);
}

bool watchful_store::check(const std::vector<std::string>& keys) {
  look();
  return inner_->check(keys);
}

void watchful_store::wait(const std::vector<std::string>& keys, duration timeout) {
  wait_for("store.wait", keys, timeout);
}

bool watchful_store::delete_key(const std::string& key) {
  return inner_->delete_key(key);
}

std::int64_t watchful_store::num_keys() {
  return inner_->num_keys();
}

void watchful_store::append(const std::string& key, const bytes& value) {
  inner_->append(key, value);
}

std::vector<bytes> watchful_store::multi_get(const std::vector<std::string>& keys) {
  wait_for("store.multi_get", keys, timeout_);
  return inner_->multi_get(keys);
}

void watchful_store::multi_set(const std::vector<std::string>& keys,
                               const std::vector<bytes>& values) {
  inner_->multi_set(keys, values);
}

std::shared_ptr<store> unwatched(const std::shared_ptr<store>& s) {
  const auto* w = dynamic_cast<const watchful_store*>(s.get());
  return w ? w->inner() : s;
}

}  // namespace troupe::detail
