#pragma once
/// troupe::testing — run a function on N in-process ranks (for doctest or any
/// other test framework).
///
///   troupe::testing::run_ranks(4, [](troupe::world& w) {
///     auto t = troupe::tensor::from_vector<float>({float(w.rank())});
///     w.default_group().allreduce(t).wait();
///     CHECK(t.to_vector<float>()[0] == 6.0f);
///   });
///
/// Each rank runs on its own thread with its own world over one shared
/// hash_store. When a rank throws, the other ranks' worlds are aborted (so
/// they do not wait for it until their timeout) and run_ranks rethrows the
/// first failure as troupe::error with "rank R: " before its message.
/// Assertion macros of doctest are thread-safe and may be used inside.
///
/// Started by a launcher (troupe-run, mpirun, srun: RANK etc. are set), the
/// same call spreads its ranks over the job's processes — rank r runs in
/// process r mod P, over the store of the environment ("env://") — so a suite
/// written for one process runs unchanged across processes and hosts. Every
/// process must make the same sequence of run_ranks calls. A function must
/// then not share state between ranks through memory (each process sees only
/// its own ranks).

#include <chrono>
#include <functional>
#include <string>

#include "troupe/world.hpp"

namespace troupe::testing {

struct run_options {
  std::string backend = "actor";
  /// Timeout of every collective and of the set-up (tests want failures fast).
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
};

void run_ranks(int n, const std::function<void(world&)>& fn, const run_options& opts = {});

}  // namespace troupe::testing
