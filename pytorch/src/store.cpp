// A c10d::Store seen as a troupe::store (see troupe_torch/store.hpp).

#include "troupe_torch/store.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "troupe/error.hpp"

namespace troupe_torch {
namespace {

std::string list(const std::vector<std::string>& keys) {
  std::string r;
  for (const auto& k : keys) r += (r.empty() ? "'" : ", '") + k + "'";
  return r;
}

bool mentions_timeout(std::string what) {
  std::transform(what.begin(), what.end(), what.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return what.find("timeout") != std::string::npos || what.find("timed out") != std::string::npos;
}

/// Runs `fn`, turning what a c10d store throws into troupe errors.
template <class F>
auto guarded(const char* op, const std::vector<std::string>& keys, F&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const troupe::error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    const auto first_line = what.substr(0, what.find('\n'));  // c10::Error adds a backtrace
    throw troupe::error(mentions_timeout(what) ? troupe::errc::timeout : troupe::errc::store,
                        std::string("c10d_store.") + op + (keys.empty() ? "" : " " + list(keys)) +
                            ": " + first_line);
  }
}

class c10d_store final : public troupe::store {
 public:
  explicit c10d_store(c10::intrusive_ptr<c10d::Store> inner)
      : troupe::store(inner->getTimeout()), inner_(std::move(inner)) {}

  void set(const std::string& key, const troupe::bytes& value) override {
    guarded("set", {key}, [&] { inner_->set(key, value); });
  }
  troupe::bytes get(const std::string& key) override {
    // Wait first with this store's timeout: c10d's get would use its own.
    wait({key}, timeout_);
    return guarded("get", {key}, [&] { return inner_->get(key); });
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return guarded("add", {key}, [&] { return inner_->add(key, delta); });
  }
  troupe::bytes compare_set(const std::string& key, const troupe::bytes& expected,
                            const troupe::bytes& desired) override {
    return guarded("compare_set", {key},
                   [&] { return inner_->compareSet(key, expected, desired); });
  }
  bool check(const std::vector<std::string>& keys) override {
    return guarded("check", keys, [&] { return inner_->check(keys); });
  }
  /// Looks with check() until the keys are there, never with c10d's wait:
  /// c10d 1.13's TCPStore leaves a wait that timed out registered on its
  /// server, whose late answer then reads as the reply to the connection's
  /// next request (an add returned 256). troupe waits in short slices (its
  /// rendezvous and group set-up look for gone ranks every 100 ms), so such
  /// waits time out all the time.
  void wait(const std::vector<std::string>& keys, duration timeout) override {
    using clock = std::chrono::steady_clock;
    const auto deadline = clock::now() + timeout;
    auto pause = std::chrono::microseconds(100);
    while (!check(keys)) {
      const auto now = clock::now();
      if (now >= deadline) {
        std::vector<std::string> missing;
        for (const auto& k : keys)
          if (!check({k})) missing.push_back(k);
        if (missing.empty()) return;  // they came at the last moment
        throw_timeout("c10d_store.wait", missing, timeout);
      }
      std::this_thread::sleep_for(std::min<clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::microseconds(10000));
    }
  }
  bool delete_key(const std::string& key) override {
    return guarded("delete_key", {key}, [&] { return inner_->deleteKey(key); });
  }
  std::int64_t num_keys() override {
    return guarded("num_keys", {}, [&] { return inner_->getNumKeys(); });
  }
  void append(const std::string& key, const troupe::bytes& value) override {
    // c10d 1.13 has no append: read, then swap in the longer value unless
    // someone changed it meanwhile.
    guarded("append", {key}, [&] {
      for (;;) {
        troupe::bytes current = inner_->check({key}) ? inner_->get(key) : troupe::bytes{};
        troupe::bytes desired = current;
        desired.insert(desired.end(), value.begin(), value.end());
        if (inner_->compareSet(key, current, desired) == desired) return;
      }
    });
  }
  std::vector<troupe::bytes> multi_get(const std::vector<std::string>& keys) override {
    wait(keys, timeout_);
    std::vector<troupe::bytes> r;
    r.reserve(keys.size());
    for (const auto& k : keys)
      r.push_back(guarded("multi_get", {k}, [&] { return inner_->get(k); }));
    return r;
  }
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<troupe::bytes>& values) override {
    check_multi_set("c10d_store.multi_set", keys.size(), values.size());
    for (std::size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
  }
  using troupe::store::set;
  using troupe::store::wait;

 private:
  c10::intrusive_ptr<c10d::Store> inner_;
};

}  // namespace

std::shared_ptr<troupe::store> wrap_store(c10::intrusive_ptr<c10d::Store> inner) {
  if (!inner)
    throw troupe::error(troupe::errc::invalid_argument, "troupe_torch.wrap_store: null store");
  return std::make_shared<c10d_store>(std::move(inner));
}

}  // namespace troupe_torch
