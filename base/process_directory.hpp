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
#include <memory>
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
  /// What `key` holds, unless it holds nothing or `stale(value)`: then what
  /// `make()` returns, put there. One at a time, so that the ranks of a
  /// process that ask together share one value (made under the directory's
  /// lock: `make` must be quick and must not use the directory).
  std::any find_or_put(const std::string& key, const std::function<std::any()>& make,
                       const std::function<bool(const std::any&)>& stale = {});
  /// What `key` holds, waiting up to `timeout` for it to appear (empty then).
  std::any wait_for(const std::string& key, std::chrono::milliseconds timeout);

 private:
  process_directory() = default;
};

/// The one T the ranks of this process share under `key` while any of them
/// holds it: the first to ask makes it with `make()` (quick: under the
/// directory's lock), the others get that one. The directory holds it
/// weakly; the entry goes with its last holder.
template <class T, class Make>
std::shared_ptr<T> shared_in_process(const std::string& key, Make make) {
  std::shared_ptr<T> mine;
  process_directory::instance().find_or_put(
      key,
      [&] {
        mine = std::shared_ptr<T>(make().release(), [key](T* p) {
          delete p;
          process_directory::instance().erase(key, [](const std::any& v) {
            const auto* w = std::any_cast<std::weak_ptr<T>>(&v);
            return w && w->expired();
          });
        });
        return std::any(std::weak_ptr<T>(mine));
      },
      [&](const std::any& v) {
        const auto* w = std::any_cast<std::weak_ptr<T>>(&v);
        mine = w ? w->lock() : nullptr;
        return !mine;
      });
  return mine;
}

}  // namespace troupe::detail
