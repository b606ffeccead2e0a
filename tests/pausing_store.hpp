#pragma once
// pausing_store — a store that hands every call to another one, except that
// a get of a key the test chose first calls `pause` with the value read: a
// test stops a rank right there (test_strangers_start stops rank 1 as it
// reads rank 0's data-plane address, attacks that port, then lets it go on).

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "troupe/store.hpp"

namespace troupe::test {

class pausing_store final : public store {
 public:
  pausing_store(std::shared_ptr<store> inner, std::function<bool(const std::string&)> is_key,
                std::function<void(const bytes&)> pause)
      : store(inner->timeout()),
        inner_(std::move(inner)),
        is_key_(std::move(is_key)),
        pause_(std::move(pause)) {}
  void set(const std::string& key, const bytes& value) override { inner_->set(key, value); }
  bytes get(const std::string& key) override {
    auto value = inner_->get(key);
    if (is_key_(key)) pause_(value);
    return value;
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return inner_->add(key, delta);
  }
  bytes compare_set(const std::string& key, const bytes& expected, const bytes& desired) override {
    return inner_->compare_set(key, expected, desired);
  }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  void wait(const std::vector<std::string>& keys, duration timeout) override {
    inner_->wait(keys, timeout);
  }
  bool delete_key(const std::string& key) override { return inner_->delete_key(key); }
  std::int64_t num_keys() override { return inner_->num_keys(); }
  void append(const std::string& key, const bytes& value) override { inner_->append(key, value); }
  std::vector<bytes> multi_get(const std::vector<std::string>& keys) override {
    return inner_->multi_get(keys);
  }
  void multi_set(const std::vector<std::string>& keys, const std::vector<bytes>& values) override {
    inner_->multi_set(keys, values);
  }
  using store::set;
  using store::wait;

  /// Whether `key` is a rank's data-plane address in the world's keys
  /// ("troupe/JOB/addr/RANK", transport/data_plane.cpp).
  static bool is_address_of(const std::string& key, int rank) {
    const auto tail = "/addr/" + std::to_string(rank);
    return key.rfind("troupe/", 0) == 0 && key.size() > tail.size() &&
           key.compare(key.size() - tail.size(), tail.size(), tail) == 0;
  }
  /// The port of a data-plane address ("host port").
  static int port_of(const bytes& address) {
    const auto text = to_string(address);
    return std::stoi(text.substr(text.rfind(' ') + 1));
  }

 private:
  std::shared_ptr<store> inner_;
  std::function<bool(const std::string&)> is_key_;
  std::function<void(const bytes&)> pause_;
};

}  // namespace troupe::test
