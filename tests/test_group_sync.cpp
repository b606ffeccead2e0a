// How the ranks of a group stay in step: sequence numbers skewed between
// ranks (one rank issued more calls than another: the calls that meet under
// one number differ, and both ranks hear a mismatch naming them; a call
// nobody else issues fails at its timeout naming the rank it waits for,
// never hangs), and groups made with use_local_synchronization by disjoint
// sets of ranks at the same time. On the default engines and on the group
// actors (TROUPE_ENGINE=actors); the suite also runs across processes.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "check_error.hpp"
#include "scoped_env.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::test::check_error;
using troupe::test::scoped_env;

namespace {

const char* const engines[] = {"inline", "actors"};

testing::run_options quick() {
  testing::run_options o;
  o.timeout = 20s;
  return o;
}

/// Runs `body` on `n` ranks of one process, on each engine.
template <class F>
void on_each_engine(int n, F body) {
  for (const char* engine : engines) {
    scoped_env env{"TROUPE_ENGINE", engine};
    CAPTURE(std::string(engine));
    testing::run_ranks(n, body, quick());
  }
}

}  // namespace

TEST_CASE("ranks whose groups issued different counts of calls fail with a mismatch naming both") {
  on_each_engine(2, [](world& w) {
    // A group of every rank (run_ranks may use the default group for
    // its own end under a launcher).
    auto group = w.new_group({0, 1});
    auto& pg = *group;
    auto t = tensor::from_vector<float>({1.0f});
    pg.allreduce(t).wait();
    // Rank 0 issues one allreduce more than rank 1: its number 2 meets
    // rank 1's barrier.
    if (w.rank() == 0) {
      auto extra = pg.allreduce(t);
      CHECK(pg.sequence_number() == 2);
      check_error([&] { extra.wait(); }, errc::mismatch,
                  {"collective mismatch", "rank 0 called allreduce (SUM) of 1 float32",
                   "rank 1 called barrier", "they differ in the collective"});
    } else {
      check_error([&] { pg.barrier().wait(); }, errc::mismatch,
                  {"collective mismatch", "rank 0 called allreduce (SUM) of 1 float32",
                   "rank 1 called barrier", "they differ in the collective"});
    }
    // Both stepped past number 2 alike: the next calls meet again.
    CHECK(pg.sequence_number() == 2);
    auto u = tensor::from_vector<float>({float(w.rank()) + 1.0f});
    pg.allreduce(u).wait();
    CHECK(u.to_vector<float>()[0] == 3.0f);
  });
}

TEST_CASE("a group one rank never creates fails its set-up at the timeout, naming that rank") {
  on_each_engine(3, [](world& w) {
    if (w.rank() == 2) return;  // never creates it
    // In one process the group's roster names the rank; across
    // processes (the ranks split over troupe-run's) the store names
    // every rank that never counted in, rank 2 among them.
    const auto start = std::chrono::steady_clock::now();
    std::string what;
    try {
      w.new_group({0, 1, 2}, {.timeout = 300ms});
    } catch (const error& e) {
      CHECK(e.code() == errc::timeout);
      what = e.what();
    }
    CAPTURE(what);
    CHECK(what.starts_with("new_group: Timed out after 300 ms waiting for rank"));
    const auto named = what.substr(0, what.find(" to create group 'group"));
    CHECK(named.size() < what.size());
    CHECK((named.ends_with("rank 2 (world rank 2)") || named.ends_with(" 2")));
    CHECK(std::chrono::steady_clock::now() - start < 15s);
  });
}

TEST_CASE("a rank ahead by a call that nobody else issues fails at its timeout, naming the rank") {
  on_each_engine(3, [](world& w) {
    auto group = w.new_group({0, 1, 2});
    auto& pg = *group;
    auto t = tensor::from_vector<float>({1.0f});
    // Ranks 0 and 1 issue two allreduces; rank 2 issues one, then a
    // barrier: number 2 meets allreduce against barrier (a mismatch
    // on every rank), and the barrier ranks 0 and 1 issue as number 3
    // waits for rank 2, which never issues a number 3.
    pg.allreduce(t).wait();
    if (w.rank() < 2) {
      check_error([&] { pg.allreduce(t).wait(); }, errc::mismatch,
                  {"ranks 0, 1 called allreduce", "rank 2 called barrier"});
      const auto start = std::chrono::steady_clock::now();
      check_error([&] { pg.barrier({.timeout = 300ms}).wait(); }, errc::timeout,
                  {"300 ms", "rank 2"});
      CHECK(std::chrono::steady_clock::now() - start < 15s);  // at its timeout, not a hang
    } else {
      check_error([&] { pg.barrier().wait(); }, errc::mismatch,
                  {"ranks 0, 1 called allreduce", "rank 2 called barrier"});
    }
  });
}

TEST_CASE("disjoint groups made with use_local_synchronization at the same time") {
  for (const char* engine : engines) {
    scoped_env env{"TROUPE_ENGINE", engine};
    for (int n : {2, 3, 4, 7}) {
      CAPTURE(std::string(engine));
      CAPTURE(n);
      testing::run_ranks(
          n,
          [n](world& w) {
            // Even and odd ranks each make their group, concurrently, twice
            // (two groups of the same members at once must not mix either).
            std::vector<int> mine;
            for (int r = w.rank() % 2; r < n; r += 2) mine.push_back(r);
            const auto calls = w.default_group().sequence_number();
            auto a = w.new_group(mine, {.use_local_synchronization = true});
            auto b = w.new_group(mine, {.use_local_synchronization = true});
            REQUIRE(a);
            REQUIRE(b);
            CHECK(a->size() == static_cast<int>(mine.size()));
            CHECK(a->name() != b->name());
            CHECK(w.get_process_group_ranks(*a) == mine);
            auto x = tensor::from_vector<float>({float(w.rank())});
            auto y = tensor::from_vector<float>({1.0f});
            auto wa = a->allreduce(x);
            auto wb = b->allreduce(y);
            wb.wait();
            wa.wait();
            float want = 0;
            for (int r : mine) want += float(r);
            CHECK(x.to_vector<float>()[0] == want);
            CHECK(y.to_vector<float>()[0] == float(mine.size()));
            // The default group did not count those calls.
            CHECK(w.default_group().sequence_number() == calls);
            auto z = tensor::from_vector<float>({1.0f});
            w.default_group().allreduce(z).wait();
            CHECK(z.to_vector<float>()[0] == float(n));
            // A group of some ranks made while the others make none.
            if (w.rank() < 2 && n > 2) {
              auto pair = w.new_group({0, 1}, {.use_local_synchronization = true});
              REQUIRE(pair);
              pair->barrier().wait();
            }
            w.default_group().barrier().wait();
          },
          quick());
    }
  }
}
