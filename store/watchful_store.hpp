#pragma once
// watchful_store — the store a group's set-up goes through (api/world.cpp):
// it forwards every call, and while its calls wait (blocking reads in 100 ms
// slices, polls such as store_based_barrier's at most every 100 ms) it asks
// whether a member of the group is known to be gone; if one is, the waiting
// call fails at once with errc::peer_failure naming it, instead of running
// into the group's timeout with a store key.

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/store.hpp"

namespace troupe::detail {

class watchful_store final : public store {
 public:
  /// `check` throws errc::peer_failure when a member is gone.
  watchful_store(std::shared_ptr<store> inner, std::function<void()> check);
  void set(const std::string& key, const bytes& value) override;
  bytes get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  bytes compare_set(const std::string& key, const bytes& expected, const bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, duration timeout) override;
  bool delete_key(const std::string& key) override;
  std::int64_t num_keys() override;
  void append(const std::string& key, const bytes& value) override;
  std::vector<bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<bytes>& values) override;
  using store::set;
  using store::wait;
  /// The store it forwards to.
  const std::shared_ptr<store>& inner() const noexcept { return inner_; }

 private:
  /// Runs the check when the last one is 100 ms old.
  void look();
  void wait_for(const char* op, const std::vector<std::string>& keys, duration timeout);

  std::shared_ptr<store> inner_;
  std::function<void()> check_;
  std::mutex mtx_;
  std::chrono::steady_clock::time_point next_look_{};
};

/// `s` without its watch where it is a watchful_store: for what must still
/// be said and read after a member is gone (a timed-out call's chain of
/// waits, base/wait_chain.hpp, which matters most then).
std::shared_ptr<store> unwatched(const std::shared_ptr<store>& s);

}  // namespace troupe::detail
