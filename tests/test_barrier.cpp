// barrier, monitored_barrier (success and the list of missing ranks),
// coalescing and sequence numbers.

#include <atomic>
#include <chrono>
#include <thread>

#include "check_error.hpp"
#include "collective_test.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::test::check_error;

TEST_CASE("barrier: nobody leaves before everybody arrived") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    std::atomic<int> arrived{0};
    testing::run_ranks(n, [&, n](world& w) {
      for (int round = 1; round <= 3; ++round) {
        if (w.rank() == n - 1) std::this_thread::sleep_for(20ms);
        arrived.fetch_add(1);
        w.default_group().barrier().wait();
        CHECK(arrived.load() >= round * n);
        w.default_group().barrier().wait();  // keep rounds apart
      }
    });
  }
}

TEST_CASE("monitored_barrier passes when everyone arrives") {
  for (int n : ct::rank_counts)
    testing::run_ranks(n, [](world& w) { w.default_group().monitored_barrier().wait(); });
}

namespace {

/// Runs a monitored barrier that ranks in `absent` skip; returns rank 0's error.
std::string missing_ranks_message(int n, std::vector<int> absent, bool wait_all) {
  std::string message;
  testing::run_ranks(n, [&](world& w) {
    if (std::find(absent.begin(), absent.end(), w.rank()) != absent.end()) return;
    auto wk = w.default_group().monitored_barrier({.timeout = 300ms, .wait_all_ranks = wait_all});
    try {
      wk.wait(10s);
    } catch (const error& e) {
      CHECK(e.code() == errc::timeout);
      if (w.rank() == 0) message = e.what();
    }
  });
  return message;
}

}  // namespace

TEST_CASE("monitored_barrier names every missing rank with wait_all_ranks") {
  auto msg = missing_ranks_message(5, {2, 4}, true);
  CHECK(msg.find("Ranks 2, 4 failed to pass monitoredBarrier") != std::string::npos);
  CHECK(msg.find("seq 1") != std::string::npos);
}

TEST_CASE("monitored_barrier names the first missing rank without wait_all_ranks") {
  auto msg = missing_ranks_message(4, {1, 3}, false);
  CHECK(msg.find("Rank 1 failed to pass monitoredBarrier") != std::string::npos);
}

TEST_CASE("monitored_barrier: the ranks that arrived hear rank 0's verdict on a missing rank") {
  // Rank 3 stays away; ranks 1 and 2 wait for rank 0's verdict (not their
  // own timeout, which is the group's) and name the missing rank.
  std::vector<std::string> what(4);
  testing::run_ranks(4, [&](world& w) {
    if (w.rank() == 3) return;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      w.default_group().monitored_barrier({.timeout = 300ms}).wait();
    } catch (const error& e) {
      CHECK(e.code() == errc::timeout);
      what[static_cast<std::size_t>(w.rank())] = e.what();
    }
    CHECK(std::chrono::steady_clock::now() - t0 < 20s);  // the group's timeout is longer
  });
  CHECK(what[0].find("Rank 3 failed to pass monitoredBarrier") != std::string::npos);
  for (int r : {1, 2}) {
    const auto& m = what[static_cast<std::size_t>(r)];
    CAPTURE(m);
    CHECK(m.find("Rank " + std::to_string(r) +
                 " successfully reached monitoredBarrier, but received errors while waiting "
                 "for send/recv from rank 0") != std::string::npos);
    CHECK(m.find("Rank 3 failed to pass monitoredBarrier") != std::string::npos);
  }
}

TEST_CASE("monitored_barrier with an expired timeout fails at once naming every missing rank") {
  // c10d's timeout of zero: rank 0 does not wait at all, even without wait_all_ranks.
  testing::run_ranks(4, [](world& w) {
    if (w.rank() != 0) return;
    const auto t0 = std::chrono::steady_clock::now();
    check_error([&] { w.default_group().monitored_barrier({.timeout = timeout_expired}).wait(); },
                errc::timeout,
                {"Rank 0 timed out in monitoredBarrier", "Ranks 1, 2, 3 had not arrived",
                 "Timed out after 0 ms"});
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  });
}

TEST_CASE("coalescing: many calls, one work") {
  testing::run_ranks(3, [](world& w) {
    auto& pg = w.default_group();
    auto a = tensor::from_vector<float>({1.f});
    auto b = tensor::from_vector<int>({w.rank()});
    pg.start_coalescing();
    pg.allreduce(a);
    pg.allreduce(b, reduce_op::MAX);
    pg.broadcast(tensor::from_vector<int>({w.rank()}), 1);
    auto all = pg.end_coalescing();
    all.wait();
    CHECK(all.is_success());
    CHECK(a.to_vector<float>()[0] == 3.f);
    CHECK(b.to_vector<int>()[0] == 2);
    CHECK(all.result().size() == 3);
    CHECK_THROWS_AS(pg.end_coalescing(), error);
  });
}

TEST_CASE("sequence numbers count collectives and agree on every member") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      CHECK(pg.sequence_number() == 0);
      for (int i = 0; i < 5; ++i) pg.allreduce(tensor::from_vector<int>({1}));
      auto wk = pg.barrier();
      wk.wait();
      CHECK(wk.sequence_number() == 6);
      auto seq = tensor::from_vector<std::int64_t>({std::int64_t(pg.sequence_number())});
      auto all = tensor::zeros({n}, dtype::int64);
      pg.allgather_into_tensor(all, seq).wait();
      for (auto s : all.to_vector<std::int64_t>()) CHECK(s == 6);
    });
  }
}

TEST_CASE("sequence_number counts calls issued but not yet finished") {
  testing::run_ranks(3, [](world& w) {
    auto& pg = w.default_group();
    std::vector<work> pending;
    for (int i = 0; i < 3; ++i) pending.push_back(pg.allreduce(tensor::from_vector<int>({i})));
    CHECK(pg.sequence_number() == 3);
    for (auto& p : pending) p.wait();
  });
}

// A group of one rank runs its calls on its own segment (or, with
// TROUPE_ENGINE=messages, its own message engine): every collective gives
// what c10d's does for one rank, in place or copied, beside the larger
// groups of the same ranks.
TEST_CASE("groups of one rank: every collective, each rank on its own group") {
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      std::vector<std::shared_ptr<process_group>> alone;
      for (int r = 0; r < n; ++r) alone.push_back(w.new_group({r}));  // every rank creates each
      auto& g = *alone[static_cast<std::size_t>(w.rank())];
      REQUIRE(g.size() == 1);
      const float base = 10.0f * static_cast<float>(w.rank() + 1);
      auto vals = [base](int k) {
        std::vector<float> v;
        for (int i = 0; i < k; ++i) v.push_back(base + static_cast<float>(i));
        return v;
      };
      auto got = [](const tensor& t) { return t.to_vector<float>(); };
      for (int k : {1, 1000, 70000}) {  // a slot, several slots, past the slots
        CAPTURE(k);
        auto t = tensor::from_vector(vals(k));
        g.allreduce(t, reduce_op::SUM).wait();
        CHECK(got(t) == vals(k));
        g.allreduce(t, reduce_op::AVG).wait();
        CHECK(got(t) == vals(k));
        g.allreduce(t, reduce_op::premul_sum(2.0)).wait();
        auto twice = vals(k);
        for (auto& x : twice) x *= 2;
        CHECK(got(t) == twice);
        t = tensor::from_vector(vals(k));
        g.reduce(t, 0, reduce_op::MAX).wait();
        g.broadcast(t, 0).wait();
        CHECK(got(t) == vals(k));
        auto out = tensor::zeros({k}, dtype::float32);
        g.allgather_into_tensor(out, t).wait();
        CHECK(got(out) == vals(k));
        auto gathered = tensor::zeros({k}, dtype::float32);
        g.gather(tensor_list{gathered}, t).wait();
        CHECK(got(gathered) == vals(k));
        auto scattered = tensor::zeros({k}, dtype::float32);
        g.scatter(scattered, tensor_list{t}).wait();
        CHECK(got(scattered) == vals(k));
        auto rs = tensor::zeros({k}, dtype::float32);
        g.reduce_scatter_tensor(rs, t).wait();
        CHECK(got(rs) == vals(k));
        auto a2a = tensor::zeros({k}, dtype::float32);
        g.alltoall_single(a2a, t).wait();
        CHECK(got(a2a) == vals(k));
        g.barrier().wait();
      }
      // Point to point has nobody to talk to.
      auto t = tensor::from_vector(vals(4));
      CHECK_THROWS_WITH_AS(g.send(t, 0), doctest::Contains("is this rank"), error);
      // The larger group of the same ranks still agrees afterwards.
      auto sum = tensor::from_vector<float>({1.0f});
      w.default_group().allreduce(sum).wait();
      CHECK(got(sum) == std::vector<float>{static_cast<float>(n)});
    });
  }
}
