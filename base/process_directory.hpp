#pragma once
// process_directory — the one process-wide name service of the ranks that
// live in this process: what a rank publishes under a key (its group actor,
// its inline engine's message medium) for the other ranks of this process
// to find. Keys look like "<job>/<group>/<rank>" plus what they name, and
// the job id comes from the store, so unrelated jobs in one process never
// meet. The only process-wide state troupe keeps besides its memory pools.

#include <any>
#include <chrono>
#include <functional>
#include <string>

namespace troupe::detail {

class process_directory {
 public:
  static process_directory& instance();
  /// Publishes `value` under `key` (replacing what was there).
  void put(const std::string& key, std::any value);
  /// Removes `key`, or only when `only_if(value)` holds.
  void erase(const std::string& key, const std::function<bool(const std::any&)>& only_if = {});
  /// What `key` holds now (empty when nothing).
  std::any find(const std::string& key);
  /// What `key` holds, waiting up to `timeout` for it to appear (empty then).
  std::any wait_for(const std::string& key, std::chrono::milliseconds timeout);

 private:
  process_directory() = default;
};

}  // namespace troupe::detail
