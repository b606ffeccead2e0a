// collective_utils: broadcast(data_or_fn) and all_gather(data_or_fn) with
// failure propagation and stage names, and all_gather_object_enforce_type,
// on 1, 2, 3, 4 and 7 ranks (also run across 2 processes), and the local
// paths without a group.

#include <doctest/doctest.h>

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "check_error.hpp"
#include "troupe/collective_utils.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
namespace cu = troupe::collective_utils;
using troupe::test::check_error;
using troupe::test::check_exact_error;

namespace {

const int rank_counts[] = {1, 2, 3, 4, 7};

struct message {
  std::string kind;
  int value = 0;
};

template <class Inspector>
auto inspect(Inspector& f, message& m) {
  return f(m.kind, m.value);
}

}  // namespace

TEST_CASE("broadcast of data sends the root's value to every rank") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int root = n - 1;
      std::map<std::string, std::vector<int>> mine{{"rank", {w.rank()}}, {"n", {n, n}}};
      auto got = cu::broadcast(mine, {.stage_name = "data", .rank = root, .pg = &pg});
      CHECK(got == std::map<std::string, std::vector<int>>{{"rank", {root}}, {"n", {n, n}}});
      // Non-root ranks may also take part without data.
      auto s = w.rank() == 0 ? cu::broadcast(std::string("from 0"), {.pg = &pg})
                             : cu::broadcast<std::string>(std::nullopt, {.pg = &pg});
      CHECK(s == "from 0");
    });
  }
}

TEST_CASE("broadcast of a function runs it on the named rank only") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int root = n / 2;
      int calls = 0;
      auto id = cu::broadcast(
          [&] {
            ++calls;
            return 1000 + w.rank();
          },
          {.stage_name = "allocate", .rank = root, .pg = &pg});
      CHECK(id == 1000 + root);
      CHECK(calls == (w.rank() == root ? 1 : 0));
    });
  }
}

TEST_CASE("an exception on the broadcasting rank makes every rank throw the seed's text") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int root = n - 1;
      auto fn = []() -> int { throw std::runtime_error("no ids left"); };
      check_exact_error(
          [&] { (void)cu::broadcast(fn, {.stage_name = "alloc", .rank = root, .pg = &pg}); },
          errc::aborted,
          "Rank " + std::to_string(root) + " failed: stage alloc: exception no ids left");
      // Without a stage name the stage is left out.
      check_exact_error([&] { (void)cu::broadcast(fn, {.rank = root, .pg = &pg}); }, errc::aborted,
                        "Rank " + std::to_string(root) + " failed: exception no ids left");
      // The group still works afterwards.
      CHECK(cu::broadcast(7, {.rank = root, .pg = &pg}) == 7);
    });
  }
}

TEST_CASE("success = false on the broadcasting rank stops every rank") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [](world& w) {
      auto& pg = w.default_group();
      const bool root = w.rank() == 0;
      check_exact_error(
          [&] {
            (void)cu::broadcast<int>(std::nullopt,
                                     {.success = !root, .stage_name = "load", .pg = &pg});
          },
          errc::aborted, "Rank 0 failed: stage load");
      // success = false with data is the caller's mistake, found before any message.
      check_error([&] { (void)cu::broadcast(5, {.success = false, .pg = &pg}); },
                  errc::invalid_argument,
                  {"Data or Function is expected to be None if not successful"});
      check_error([&] { (void)cu::broadcast([] { return 5; }, {.success = false, .pg = &pg}); },
                  errc::invalid_argument,
                  {"Data or Function is expected to be None if not successful"});
    });
  }
}

TEST_CASE("stage names are checked across ranks") {
  for (int n : rank_counts) {
    if (n < 2) continue;
    CAPTURE(n);
    testing::run_ranks(n, [](world& w) {
      auto& pg = w.default_group();
      const std::string stage = w.rank() == 1 ? "evaluate" : "train";
      check_exact_error([&] { (void)cu::broadcast(w.rank(), {.stage_name = stage, .pg = &pg}); },
                        errc::mismatch,
                        "broadcast: Unexpected stage name received from rank 1: evaluate");
      check_exact_error([&] { (void)cu::all_gather(w.rank(), {.stage_name = stage, .pg = &pg}); },
                        errc::mismatch,
                        "all_gather: Unexpected stage name received from rank 1: evaluate");
      // A missing name differs from a given one (Python's None).
      std::optional<std::string> maybe;
      if (w.rank() != 1) maybe = "train";
      check_exact_error([&] { (void)cu::all_gather(1, {.stage_name = maybe, .pg = &pg}); },
                        errc::mismatch,
                        "all_gather: Unexpected stage name received from rank 1: None");
    });
  }
}

TEST_CASE("all_gather returns every rank's data or result in rank order") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      auto names = cu::all_gather(std::string(static_cast<std::size_t>(w.rank()), 'x'),
                                  {.stage_name = "names", .pg = &pg});
      REQUIRE(names.size() == static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r)
        CHECK(names[static_cast<std::size_t>(r)] == std::string(static_cast<std::size_t>(r), 'x'));
      int calls = 0;
      auto squares = cu::all_gather(
          [&] {
            ++calls;
            return std::vector<int>{w.rank() * w.rank()};
          },
          {.pg = &pg});
      CHECK(calls == 1);
      for (int r = 0; r < n; ++r)
        CHECK(squares[static_cast<std::size_t>(r)] == std::vector<int>{r * r});
    });
  }
}

TEST_CASE("all_gather names every failing rank and its error on every rank") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      auto fn = [&]() -> int {
        if (w.rank() % 2 == 1)
          throw std::runtime_error("port " + std::to_string(w.rank()) + " busy");
        return w.rank();
      };
      if (n == 1) {
        CHECK(cu::all_gather(fn, {.stage_name = "probe", .pg = &pg}) == std::vector<int>{0});
        return;
      }
      std::string want = "all_gather: ";
      for (int r = 1; r < n; r += 2)
        want += std::string(r > 1 ? "; " : "") + "Rank " + std::to_string(r) +
                " failed: stage probe: exception port " + std::to_string(r) + " busy";
      check_exact_error([&] { (void)cu::all_gather(fn, {.stage_name = "probe", .pg = &pg}); },
                        errc::aborted, want);
    });
  }
}

TEST_CASE("a rank passing another type fails every rank with the seed's type message") {
  for (int n : rank_counts) {
    if (n < 2) continue;
    CAPTURE(n);
    testing::run_ranks(n, [](world& w) {
      auto& pg = w.default_group();
      const std::string want =
          "Object type at index 1 is std::string, while first object type is int";
      if (w.rank() == 1) {
        check_exact_error([&] { (void)cu::all_gather(std::string("one"), {.pg = &pg}); },
                          errc::mismatch, want);
        check_exact_error([&] { (void)cu::all_gather_object_enforce_type(pg, std::string("one")); },
                          errc::mismatch, want);
      } else {
        check_exact_error([&] { (void)cu::all_gather(w.rank(), {.pg = &pg}); }, errc::mismatch,
                          want);
        check_exact_error([&] { (void)cu::all_gather_object_enforce_type(pg, w.rank()); },
                          errc::mismatch, want);
      }
    });
  }
}

TEST_CASE("all_gather_object_enforce_type with a pluggable checker") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const cu::type_checker<message> by_kind{
          [](const message& a, const message& b) { return a.kind == b.kind; },
          [](const message& m) { return m.kind; }};
      // All alike: every object comes back.
      auto all = cu::all_gather_object_enforce_type(pg, message{"gradient", w.rank()}, by_kind);
      REQUIRE(all.size() == static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) CHECK(all[static_cast<std::size_t>(r)].value == r);
      if (n < 3) return;
      // Rank 2 sends another kind: every rank fails naming index 2 and both kinds.
      const message m{w.rank() == 2 ? "heartbeat" : "gradient", w.rank()};
      check_exact_error([&] { (void)cu::all_gather_object_enforce_type(pg, m, by_kind); },
                        errc::mismatch,
                        "Object type at index 2 is heartbeat, while first object type is gradient");
      // The default checker only compares C++ types: the same call passes.
      CHECK(cu::all_gather_object_enforce_type(pg, m).size() == static_cast<std::size_t>(n));
    });
  }
}

TEST_CASE("without a group both run locally (the seed's pg=None paths)") {
  int calls = 0;
  CHECK(cu::broadcast([&] { return ++calls; }) == 1);
  CHECK(cu::broadcast(std::string("x"), {.stage_name = "s"}) == "x");
  check_exact_error(
      [] {
        (void)cu::broadcast([]() -> int { throw std::runtime_error("bad"); }, {.stage_name = "s"});
      },
      errc::aborted, "Rank 0 failed: stage s: exception bad");
  check_exact_error([] { (void)cu::broadcast<int>(std::nullopt, {.success = false}); },
                    errc::aborted, "Rank 0 failed");
  check_error([] { (void)cu::broadcast(1, {.rank = 2}); }, errc::invalid_argument,
              {"broadcast", "only rank 0", "rank 2"});
  CHECK(cu::all_gather(3) == std::vector<int>{3});
  CHECK(cu::all_gather([] { return 4.5; }) == std::vector<double>{4.5});
  check_exact_error([] { (void)cu::all_gather([]() -> int { throw std::runtime_error("oops"); }); },
                    errc::aborted, "all_gather failed with exception oops");
}

TEST_CASE("a broadcasting rank outside the group is refused on every rank") {
  testing::run_ranks(2, [](world& w) {
    check_error([&] { (void)cu::broadcast(1, {.rank = 2, .pg = &w.default_group()}); },
                errc::invalid_argument, {"broadcast", "rank 2", "size 2"});
  });
}
