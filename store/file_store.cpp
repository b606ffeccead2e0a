/// file_store: a store kept in one file, shared by processes on one host.
///
/// Every operation opens the file (so each has its own open file description and
/// flock excludes other objects and threads of this process too), takes LOCK_EX,
/// reads all records, applies itself and rewrites the file if it changed. Closing
/// the descriptor releases the lock. Records are [u64 key size][key][u64 value
/// size][value] in host byte order (the file never leaves the host).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <system_error>
#include <thread>

#include "troupe/error.hpp"
#include "troupe/store.hpp"

namespace troupe {
namespace {

using kv_map = std::map<std::string, bytes>;

[[noreturn]] void throw_sys(const char* op, const char* what, const std::string& path) {
  int err = errno;
  throw error(errc::store, std::string(op) + ": cannot " + what + " '" + path +
                               "': " + std::generic_category().message(err));
}

int open_file(const char* op, const std::string& path) {
  int fd = -1;
  do {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw_sys(op, "open", path);
  return fd;
}

/// The store file, open and exclusively locked for one operation.
class locked_file {
 public:
  locked_file(const char* op, const std::string& path)
      : op_(op), path_(path), fd_(open_file(op, path)) {
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd_);
      errno = err;
      throw_sys(op_, "lock", path_);
    }
  }
  ~locked_file() { ::close(fd_); }
  locked_file(const locked_file&) = delete;
  locked_file& operator=(const locked_file&) = delete;

  kv_map read() const {
    std::string buf;
    char chunk[65536];
    for (off_t off = 0;;) {
      ssize_t n = ::pread(fd_, chunk, sizeof chunk, off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_sys(op_, "read", path_);
      if (n == 0) break;
      buf.append(chunk, static_cast<std::size_t>(n));
      off += n;
    }
    kv_map map;
    std::size_t pos = 0;
    auto take = [&](std::string& out) {
      std::uint64_t size = 0;
      if (buf.size() - pos < sizeof size) corrupt();
      std::memcpy(&size, buf.data() + pos, sizeof size);
      pos += sizeof size;
      if (buf.size() - pos < size) corrupt();
      out.assign(buf, pos, size);
      pos += size;
    };
    std::string key, value;
    while (pos < buf.size()) {
      take(key);
      take(value);
      map[key] = bytes(value.begin(), value.end());
    }
    return map;
  }

  void write(const kv_map& map) const {
    std::string buf;
    auto put = [&](const char* data, std::size_t size) {
      std::uint64_t n = size;
      buf.append(reinterpret_cast<const char*>(&n), sizeof n);
      buf.append(data, size);
    };
    for (const auto& [k, v] : map) {
      put(k.data(), k.size());
      put(reinterpret_cast<const char*>(v.data()), v.size());
    }
    for (std::size_t done = 0; done < buf.size();) {
      ssize_t n = ::pwrite(fd_, buf.data() + done, buf.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_sys(op_, "write", path_);
      done += static_cast<std::size_t>(n);
    }
    if (::ftruncate(fd_, static_cast<off_t>(buf.size())) != 0) throw_sys(op_, "truncate", path_);
  }

 private:
  [[noreturn]] void corrupt() const {
    throw error(errc::store, std::string(op_) + ": corrupt store file '" + path_ + "'");
  }

  const char* op_;
  const std::string& path_;
  int fd_;
};

bool has_all(const kv_map& map, const std::vector<std::string>& keys) {
  return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return map.count(k) != 0; });
}

}  // namespace

file_store::file_store(std::string path, duration timeout)
    : store(timeout), path_(std::move(path)) {
  ::close(open_file("file_store", path_));
}

file_store::~file_store() = default;

std::vector<bytes> file_store::wait_for(const char* op, const std::vector<std::string>& keys,
                                        duration timeout) {
  using clock = std::chrono::steady_clock;
  const auto limit = std::clamp(timeout, duration::zero(), duration(std::chrono::hours(876000)));
  const auto deadline = clock::now() + limit;
  auto backoff = std::chrono::microseconds(100);
  for (;;) {
    kv_map map = locked_file(op, path_).read();
    if (has_all(map, keys)) {
      std::vector<bytes> values;
      values.reserve(keys.size());
      for (const auto& k : keys) values.push_back(std::move(map.at(k)));
      return values;
    }
    const auto now = clock::now();
    if (now >= deadline) {
      std::vector<std::string> missing;
      for (const auto& k : keys) {
        if (map.count(k) == 0) missing.push_back(k);
      }
      throw_timeout(op, missing, timeout);
    }
    std::this_thread::sleep_for(std::min<clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::microseconds(10000));
  }
}

void file_store::set(const std::string& key, const bytes& value) {
  locked_file f("file_store.set", path_);
  kv_map map = f.read();
  map[key] = value;
  f.write(map);
}

bytes file_store::get(const std::string& key) {
  return std::move(wait_for("file_store.get", {key}, timeout_).front());
}

std::int64_t file_store::add(const std::string& key, std::int64_t delta) {
  locked_file f("file_store.add", path_);
  kv_map map = f.read();
  auto it = map.find(key);
  std::int64_t value =
      add_to_counter("file_store.add", key, it == map.end() ? nullptr : &it->second, delta);
  map[key] = to_bytes(std::to_string(value));
  f.write(map);
  return value;
}

bytes file_store::compare_set(const std::string& key, const bytes& expected, const bytes& desired) {
  locked_file f("file_store.compare_set", path_);
  kv_map map = f.read();
  auto it = map.find(key);
  if (it == map.end() && !expected.empty()) return expected;
  if (it != map.end() && it->second != expected) return it->second;
  map[key] = desired;
  f.write(map);
  return desired;
}

bool file_store::check(const std::vector<std::string>& keys) {
  return has_all(locked_file("file_store.check", path_).read(), keys);
}

void file_store::wait(const std::vector<std::string>& keys, duration timeout) {
  wait_for("file_store.wait", keys, timeout);
}

bool file_store::delete_key(const std::string& key) {
  locked_file f("file_store.delete_key", path_);
  kv_map map = f.read();
  if (map.erase(key) == 0) return false;
  f.write(map);
  return true;
}

std::int64_t file_store::num_keys() {
  return static_cast<std::int64_t>(locked_file("file_store.num_keys", path_).read().size());
}

void file_store::append(const std::string& key, const bytes& value) {
  locked_file f("file_store.append", path_);
  kv_map map = f.read();
  auto& v = map[key];
  v.insert(v.end(), value.begin(), value.end());
  f.write(map);
}

std::vector<bytes> file_store::multi_get(const std::vector<std::string>& keys) {
  return wait_for("file_store.multi_get", keys, timeout_);
}

void file_store::multi_set(const std::vector<std::string>& keys, const std::vector<bytes>& values) {
  check_multi_set("file_store.multi_set", keys.size(), values.size());
  locked_file f("file_store.multi_set", path_);
  kv_map map = f.read();
  for (std::size_t i = 0; i < keys.size(); ++i) map[keys[i]] = values[i];
  f.write(map);
}

}  // namespace troupe
