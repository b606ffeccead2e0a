#pragma once
/// troupe::store — the key-value store ranks rendezvous through (c10d's Store).
///
/// Values are bytes. Every blocking call has a timeout (the store's default
/// unless one is passed); running past it throws troupe::error with
/// errc::timeout and a message containing "Timed out" and the key(s).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace troupe {

using bytes = std::vector<std::uint8_t>;

/// Converts between strings and store values.
bytes to_bytes(const std::string& s);
std::string to_string(const bytes& b);

class store {
 public:
  using duration = std::chrono::milliseconds;
  /// The default timeout of blocking calls (c10d's default: 300 s).
  static constexpr duration default_timeout = std::chrono::seconds(300);

  explicit store(duration timeout = default_timeout) : timeout_(timeout) {}
  virtual ~store() = default;
  store(const store&) = delete;
  store& operator=(const store&) = delete;

  /// Sets `key` to `value`, replacing any old value.
  virtual void set(const std::string& key, const bytes& value) = 0;
  /// Returns the value of `key`, waiting until it exists or the timeout passes.
  virtual bytes get(const std::string& key) = 0;
  /// Adds `delta` to the integer stored at `key` (0 if absent); returns the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  /// Sets `key` to `desired` if its value equals `expected` (or if it is absent and
  /// `expected` is empty); returns the value the key has afterwards (c10d semantics:
  /// absent key with non-empty `expected` returns `expected`).
  virtual bytes compare_set(const std::string& key, const bytes& expected,
                            const bytes& desired) = 0;
  /// Whether all `keys` exist, without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  /// Waits until all `keys` exist or `timeout` passes.
  virtual void wait(const std::vector<std::string>& keys, duration timeout) = 0;
  /// Removes `key`; returns whether it existed.
  virtual bool delete_key(const std::string& key) = 0;
  /// Number of keys in the store.
  virtual std::int64_t num_keys() = 0;
  /// Appends `value` to the value of `key` (creating it).
  virtual void append(const std::string& key, const bytes& value) = 0;
  /// Gets every key, waiting for all of them (one timeout for the whole call).
  virtual std::vector<bytes> multi_get(const std::vector<std::string>& keys) = 0;
  /// Sets every key to the value at the same index.
  virtual void multi_set(const std::vector<std::string>& keys,
                         const std::vector<bytes>& values) = 0;

  /// Waits with the store's default timeout.
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  void set(const std::string& key, const std::string& value) { set(key, to_bytes(value)); }
  std::string get_string(const std::string& key) { return to_string(get(key)); }

  duration timeout() const noexcept { return timeout_; }
  void set_timeout(duration t) noexcept { timeout_ = t; }

 protected:
  // Helpers shared by the implementations (they name `op` in their messages).
  /// Adds `delta` to the decimal integer `current` (null: absent, counts as 0);
  /// throws errc::invalid_argument naming `key` if it is not an integer or overflows.
  static std::int64_t add_to_counter(const char* op, const std::string& key, const bytes* current,
                                     std::int64_t delta);
  /// Throws errc::timeout naming the `missing` keys and `timeout`.
  [[noreturn]] static void throw_timeout(const char* op, const std::vector<std::string>& missing,
                                         duration timeout);
  /// Throws errc::invalid_argument unless multi_set got as many values as keys.
  static void check_multi_set(const char* op, std::size_t num_keys, std::size_t num_values);

  duration timeout_;
};

/// An in-process store shared by ranks living in one process.
class hash_store final : public store {
 public:
  explicit hash_store(duration timeout = default_timeout);
  ~hash_store() override;
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

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// A store kept in one file, shared by processes on one host (locked with flock).
///
/// Every operation opens the file, takes an exclusive flock, reads it, applies
/// itself and rewrites it; blocking calls poll. The file is never removed.
class file_store final : public store {
 public:
  explicit file_store(std::string path, duration timeout = default_timeout);
  ~file_store() override;
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
  const std::string& path() const noexcept { return path_; }

 private:
  /// Polls until all `keys` exist; returns their values (in order) from one snapshot.
  std::vector<bytes> wait_for(const char* op, const std::vector<std::string>& keys,
                              duration timeout);
  std::string path_;
};

/// Prepends "prefix/" to every key and forwards to another store.
///
/// Blocking calls use this store's timeout (initially the inner store's).
/// num_keys() counts every key of the inner store, not only this prefix's (as c10d).
class prefix_store final : public store {
 public:
  prefix_store(std::string prefix, std::shared_ptr<store> inner);
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
  const std::string& prefix() const noexcept { return prefix_; }
  const std::shared_ptr<store>& underlying() const noexcept { return inner_; }

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::vector<std::string> key(const std::vector<std::string>& ks) const {
    std::vector<std::string> out;
    out.reserve(ks.size());
    for (const auto& k : ks) out.push_back(key(k));
    return out;
  }
  /// Waits with this store's timeout (the inner get would use the inner store's).
  void wait_before(const char* op, const std::vector<std::string>& full_keys);
  std::string prefix_;
  std::shared_ptr<store> inner_;
};

/// Blocks until `world_size` ranks have called it with the same `group_name`, or
/// throws errc::timeout with "Timed out initializing process group in store based
/// barrier" and the list of ranks that did not arrive.
void store_based_barrier(store& s, int rank, int world_size, const std::string& group_name,
                         std::chrono::milliseconds timeout);

}  // namespace troupe
