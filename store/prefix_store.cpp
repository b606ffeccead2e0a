/// prefix_store: namespaces keys as "prefix/key" in another store.
#include "troupe/error.hpp"
#include "troupe/store.hpp"

namespace troupe {

prefix_store::prefix_store(std::string prefix, std::shared_ptr<store> inner)
    : store(inner ? inner->timeout() : default_timeout),
      prefix_(std::move(prefix)),
      inner_(std::move(inner)) {
  if (!inner_) {
    throw error(errc::invalid_argument,
                "prefix_store: inner store of prefix '" + prefix_ + "' is null");
  }
}

void prefix_store::wait_before(const char* op, const std::vector<std::string>& full_keys) {
  try {
    inner_->wait(full_keys, timeout_);
  } catch (const error& e) {
    if (e.code() != errc::timeout) throw;
    throw error(errc::timeout, std::string(op) + ": " + e.what());
  }
}

void prefix_store::set(const std::string& k, const bytes& value) {
  inner_->set(key(k), value);
}

bytes prefix_store::get(const std::string& k) {
  wait_before("prefix_store.get", {key(k)});
  return inner_->get(key(k));
}

std::int64_t prefix_store::add(const std::string& k, std::int64_t delta) {
  return inner_->add(key(k), delta);
}

bytes prefix_store::compare_set(const std::string& k, const bytes& expected, const bytes& desired) {
  return inner_->compare_set(key(k), expected, desired);
}

bool prefix_store::check(const std::vector<std::string>& keys) {
  return inner_->check(key(keys));
}

void prefix_store::wait(const std::vector<std::string>& keys, duration timeout) {
  inner_->wait(key(keys), timeout);
}

bool prefix_store::delete_key(const std::string& k) {
  return inner_->delete_key(key(k));
}

/// Counts every key of the inner store, not only this prefix's (as c10d's PrefixStore).
std::int64_t prefix_store::num_keys() {
  return inner_->num_keys();
}

void prefix_store::append(const std::string& k, const bytes& value) {
  inner_->append(key(k), value);
}

std::vector<bytes> prefix_store::multi_get(const std::vector<std::string>& keys) {
  auto full = key(keys);
  wait_before("prefix_store.multi_get", full);
  return inner_->multi_get(full);
}

void prefix_store::multi_set(const std::vector<std::string>& keys,
                             const std::vector<bytes>& values) {
  check_multi_set("prefix_store.multi_set", keys.size(), values.size());
  inner_->multi_set(key(keys), values);
}

}  // namespace troupe
