#pragma once
// Worlds of n ranks in this process, created concurrently (set-up is
// collective), for tests that drive every rank from one thread.

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "troupe/troupe.hpp"

namespace troupe::test {

inline std::vector<std::unique_ptr<world>> make_worlds(
    int n, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto st = std::make_shared<hash_store>();
  std::vector<std::unique_ptr<world>> ws(static_cast<std::size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      world_options o;
      o.store = st;
      o.rank = r;
      o.world_size = n;
      o.timeout = timeout;
      ws[static_cast<std::size_t>(r)] = std::make_unique<world>(o);
    });
  for (auto& t : ts) t.join();
  return ws;
}

}  // namespace troupe::test
