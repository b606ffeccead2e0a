/// Helpers shared by every store, and store_based_barrier.
#include <algorithm>
#include <charconv>
#include <string>
#include <thread>

#include "base/texts.hpp"
#include "troupe/error.hpp"
#include "troupe/store.hpp"

namespace troupe {

bytes to_bytes(const std::string& s) {
  return bytes(s.begin(), s.end());
}

std::string to_string(const bytes& b) {
  return std::string(b.begin(), b.end());
}

std::int64_t store::add_to_counter(const char* op, const std::string& key, const bytes* current,
                                   std::int64_t delta) {
  std::int64_t value = 0;
  if (current) {
    const char* first = reinterpret_cast<const char*>(current->data());
    const char* last = first + current->size();
    auto [end, ec] = std::from_chars(first, last, value);
    if (current->empty() || ec != std::errc() || end != last) {
      throw error(errc::invalid_argument, std::string(op) + ": value of key '" + key +
                                              "' is not an integer: '" + to_string(*current) + "'");
    }
  }
  std::int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum)) {
    throw error(errc::invalid_argument, std::string(op) + ": adding " + std::to_string(delta) +
                                            " to key '" + key + "' (" + std::to_string(value) +
                                            ") overflows");
  }
  return sum;
}

void store::throw_timeout(const char* op, const std::vector<std::string>& missing,
                          duration timeout) {
  std::string msg = std::string(op) + ": " + detail::timeout_after(timeout) + " waiting for ";
  if (missing.size() == 1) {
    msg += "key '" + missing.front() + "'";
  } else {
    msg += "keys [";
    for (std::size_t i = 0; i < missing.size(); ++i) {
      msg += (i ? ", '" : "'") + missing[i] + "'";
    }
    msg += "]";
  }
  throw error(errc::timeout, msg);
}

void store::check_multi_set(const char* op, std::size_t num_keys, std::size_t num_values) {
  if (num_keys != num_values) {
    throw error(errc::invalid_argument, std::string(op) + ": got " + std::to_string(num_keys) +
                                            " keys but " + std::to_string(num_values) + " values");
  }
}

void store_based_barrier(store& s, int rank, int world_size, const std::string& group_name,
                         std::chrono::milliseconds timeout) {
  if (world_size <= 0 || rank < 0 || rank >= world_size) {
    throw error(errc::invalid_argument,
                "store_based_barrier: rank " + std::to_string(rank) +
                    " is not in [0, world_size=" + std::to_string(world_size) + ")");
  }
  const std::string key = "store_based_barrier_key:" + group_name;
  auto rank_key = [&](int r) { return key + "/rank/" + std::to_string(r); };
  s.add(key, 1);
  s.set(rank_key(rank), "1");

  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto backoff = std::chrono::microseconds(100);
  for (;;) {
    // ">=" rather than "==": a late poller must still pass if the key was reused.
    std::int64_t joined = s.add(key, 0);
    if (joined >= world_size) return;
    if (clock::now() - start >= timeout) {
      std::string missing;
      for (int r = 0; r < world_size; ++r) {
        if (s.check({rank_key(r)})) continue;
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw error(errc::timeout,
                  "Timed out initializing process group in store based barrier on rank " +
                      std::to_string(rank) + ", for key: " + key +
                      " (world_size=" + std::to_string(world_size) + ", num_workers_joined=" +
                      std::to_string(joined) + ", timeout=" + std::to_string(timeout.count()) +
                      " ms, missing ranks: [" + missing + "])");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::microseconds(10000));
  }
}

}  // namespace troupe
