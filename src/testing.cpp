#include "troupe/testing.hpp"

#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "troupe/error.hpp"

namespace troupe::testing {

void run_ranks(int n, const std::function<void(world&)>& fn, const run_options& opts) {
  if (n < 1)
    throw error(errc::invalid_argument,
                "run_ranks: n " + std::to_string(n) + " must be at least 1");
  auto store = std::make_shared<hash_store>(opts.timeout);
  std::mutex mtx;
  std::vector<world*> worlds(static_cast<std::size_t>(n), nullptr);
  std::exception_ptr first;
  int first_rank = -1;
  auto fail = [&](int rank, std::exception_ptr e) {
    std::lock_guard<std::mutex> g{mtx};
    if (!first) {
      first = e;
      first_rank = rank;
    }
    for (int r = 0; r < n; ++r)
      if (r != rank && worlds[static_cast<std::size_t>(r)])
        worlds[static_cast<std::size_t>(r)]->abort("rank " + std::to_string(rank) + " failed");
  };
  // Worlds stay alive until every rank finished its function: a rank that is
  // done must not take its group actors away from ranks still receiving.
  std::condition_variable all_done_cv;
  int done = 0;
  auto finish = [&] {
    std::unique_lock<std::mutex> g{mtx};
    if (++done == n) all_done_cv.notify_all();
    all_done_cv.wait(g, [&] { return done == n; });
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        world_options o;
        o.backend = opts.backend;
        o.store = store;
        o.rank = r;
        o.world_size = n;
        o.timeout = opts.timeout;
        world w{o};
        {
          std::lock_guard<std::mutex> g{mtx};
          worlds[static_cast<std::size_t>(r)] = &w;
          if (first) w.abort("rank " + std::to_string(first_rank) + " failed");
        }
        try {
          fn(w);
        } catch (...) {
          fail(r, std::current_exception());
        }
        finish();
        std::lock_guard<std::mutex> g{mtx};
        worlds[static_cast<std::size_t>(r)] = nullptr;
      } catch (...) {
        fail(r, std::current_exception());
        finish();
      }
    });
  for (auto& t : threads) t.join();
  if (!first) return;
  try {
    std::rethrow_exception(first);
  } catch (const error& e) {
    throw error(e.code(), "rank " + std::to_string(first_rank) + ": " + e.what());
  } catch (const std::exception& e) {
    throw error(errc::internal, "rank " + std::to_string(first_rank) + ": " + e.what());
  }
}

}  // namespace troupe::testing
