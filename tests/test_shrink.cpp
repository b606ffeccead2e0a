// Recovery: after a member dies or leaves, the survivors agree on who is left
// (world::shrink) and go on in a new group of them.

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "check_error.hpp"
#include "make_worlds.hpp"
#include "troupe/troupe.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::test::check_error;
using troupe::test::make_worlds;

namespace {

/// Runs f(rank) on a thread per rank in `ranks`, joins them all.
template <class F>
void on_ranks(const std::vector<int>& ranks, F f) {
  std::vector<std::thread> ts;
  for (int r : ranks) ts.emplace_back([&f, r] { f(r); });
  for (auto& t : ts) t.join();
}

}  // namespace

TEST_CASE("the survivors of a left rank shrink and go on, twice") {
  auto ws = make_worlds(4, 10s);
  // Everyone works, then world rank 1 leaves (its world is destroyed).
  on_ranks({0, 1, 2, 3}, [&](int r) {
    auto x = tensor::from_vector<float>({float(r)});
    ws[static_cast<std::size_t>(r)]->default_group().allreduce(x).wait();
    CHECK(x.to_vector<float>()[0] == 6.0f);
  });
  ws[1].reset();
  std::vector<std::shared_ptr<process_group>> g1(4);
  on_ranks({0, 2, 3}, [&](int r) {
    auto& w = *ws[static_cast<std::size_t>(r)];
    // The old group fails, naming the rank that left.
    auto x = tensor::from_vector<float>({1.0f});
    check_error([&] { w.default_group().allreduce(x).wait(); }, errc::peer_failure,
                {"allreduce", "rank 1"});
    auto g = w.shrink(w.default_group(), 10s);
    REQUIRE(g);
    CHECK(g->size() == 3);
    CHECK(g->global_ranks() == std::vector<int>{0, 2, 3});
    CHECK(g->rank() == (r == 0 ? 0 : r - 1));
    auto y = tensor::from_vector<float>({float(r)});
    g->allreduce(y).wait();
    CHECK(y.to_vector<float>()[0] == 5.0f);
    CHECK(g->sequence_number() == 1);
    g1[static_cast<std::size_t>(r)] = g;
  });
  // Then world rank 3 leaves too: shrink the shrunk group.
  g1[3].reset();
  ws[3].reset();
  on_ranks({0, 2}, [&](int r) {
    auto& w = *ws[static_cast<std::size_t>(r)];
    auto& g = *g1[static_cast<std::size_t>(r)];
    auto x = tensor::from_vector<float>({1.0f});
    check_error([&] { g.allreduce(x).wait(); }, errc::peer_failure, {"allreduce", "rank"});
    auto g2 = w.shrink(g, 10s);
    CHECK(g2->global_ranks() == std::vector<int>{0, 2});
    auto y = tensor::from_vector<float>({float(r + 1)});
    g2->allreduce(y).wait();
    CHECK(y.to_vector<float>()[0] == 4.0f);
    // Point to point works in it too.
    auto z = tensor::from_vector<std::int32_t>({r == 0 ? 42 : 0});
    if (g2->rank() == 0) g2->send(z, 1, {}).wait();
    if (g2->rank() == 1) {
      g2->recv(z, 0, {}).wait();
      CHECK(z.to_vector<std::int32_t>()[0] == 42);
    }
  });
}

TEST_CASE("a rank that never calls shrink is counted out when the time is up") {
  auto ws = make_worlds(3, 10s);
  // World rank 2 stays alive but never joins the shrink (frozen).
  on_ranks({0, 1}, [&](int r) {
    auto& w = *ws[static_cast<std::size_t>(r)];
    const auto t0 = std::chrono::steady_clock::now();
    auto g = w.shrink(w.default_group(), 300ms);
    CHECK(std::chrono::steady_clock::now() - t0 >= 250ms);
    CHECK(g->global_ranks() == std::vector<int>{0, 1});
    auto y = tensor::from_vector<float>({1.0f});
    g->allreduce(y).wait();
    CHECK(y.to_vector<float>()[0] == 2.0f);
  });
  // When it comes late, the others' decision stands and names it.
  check_error([&] { ws[2]->shrink(ws[2]->default_group(), 300ms); }, errc::peer_failure,
              {"shrink", "counted this rank (2) out"});
}

TEST_CASE("shrink refuses bad arguments") {
  auto ws = make_worlds(1, 10s);
  check_error([&] { ws[0]->shrink(ws[0]->default_group(), 0ms); }, errc::invalid_argument,
              {"shrink", "timeout 0 ms"});
  // One rank alone shrinks to itself.
  auto g = ws[0]->shrink(ws[0]->default_group(), 1s);
  CHECK(g->size() == 1);
}
