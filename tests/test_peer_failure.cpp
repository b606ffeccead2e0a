// A rank that leaves (its world is destroyed) fails exactly the calls that
// still need it, with errc::peer_failure naming it, instead of leaving its
// peers waiting until their timeout. A store serves several worlds in turn.

#include <chrono>
#include <latch>
#include <thread>

#include "check_error.hpp"
#include "troupe/testing.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::test::check_error;

namespace {

world_options options(std::shared_ptr<store> s, int rank, int size, std::chrono::milliseconds t) {
  world_options o;
  o.store = std::move(s);
  o.rank = rank;
  o.world_size = size;
  o.timeout = t;
  return o;
}

/// Runs fn(rank, world) on n ranks with plain threads: unlike run_ranks, each
/// world is destroyed as soon as its own function returns.
template <class F>
void run_unsynchronised(int n, F fn) {
  auto store = std::make_shared<hash_store>(20s);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([=] {
      world w{options(store, r, n, 60s)};
      fn(r, w);
    });
  for (auto& t : threads) t.join();
}

}  // namespace

TEST_CASE("a collective that needs a rank that left fails fast, naming it") {
  std::latch left{1};
  run_unsynchronised(3, [&](int rank, world& w) {
    if (rank == 2) {
      left.count_down();  // leaves without joining the allreduce
      return;
    }
    left.wait();
    auto t = tensor::from_vector<float>({1.f});
    const auto start = std::chrono::steady_clock::now();
    // Rank 0 waits for rank 2 and names it. Rank 1 names rank 2 too, or rank
    // 0 if rank 0 already failed and left.
    check_error([&] { w.default_group().allreduce(t).wait(); }, errc::peer_failure,
                {"allreduce", rank == 0 ? "rank 2" : "rank", "left group 'default'"});
    // Failing takes far less than the 60 s collective timeout.
    CHECK(std::chrono::steady_clock::now() - start < 30s);
  });
}

TEST_CASE("messages sent before a rank left are still received; later receives fail") {
  std::latch sent{1};
  std::latch gone{1};
  run_unsynchronised(2, [&](int rank, world& w) {
    auto& pg = w.default_group();
    if (rank == 1) {
      pg.send(tensor::from_vector<int>({42}), 0).wait();
      sent.count_down();
      return;  // leaves
    }
    sent.wait();
    std::this_thread::sleep_for(100ms);  // let rank 1's world go away
    auto t = tensor::zeros({1}, dtype::int32);
    pg.recv(t, 1).wait();
    CHECK(t.to_vector<int>()[0] == 42);
    check_error([&] { pg.recv(t, 1).wait(); }, errc::peer_failure, {"recv", "rank 1", "left"});
    check_error([&] { pg.send(t, 1).wait(); }, errc::peer_failure, {"send", "rank 1", "left"});
    gone.count_down();
  });
}

TEST_CASE("one store serves several worlds one after another") {
  auto store = std::make_shared<hash_store>(20s);
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([=] {
        if (r == 0 && round > 0) std::this_thread::sleep_for(100ms);  // rank 0 comes late
        world w{options(store, r, 2, 20s)};
        auto t = tensor::from_vector<int>({r + round});
        w.default_group().allreduce(t).wait();
        CHECK(t.to_vector<int>()[0] == 1 + 2 * round);
        w.default_group().barrier().wait();
      });
    for (auto& t : threads) t.join();
  }
}
