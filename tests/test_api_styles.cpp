// The call styles users write, kept compiling (and right): c10d's option
// shapes, troupe's shorthands, and the fragments README.md shows. A change
// of the public API that breaks one of them fails here first; CHANGELOG.md
// lists every such change on purpose.

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "check_error.hpp"
#include "collective_test.hpp"
#include "make_worlds.hpp"
#include "scoped_env.hpp"
#include "troupe/troupe.hpp"

using namespace troupe;
using namespace std::chrono_literals;

TEST_CASE("allreduce_coalesced takes c10d's options, troupe's and none") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    auto v = [&](float x) { return tensor::from_vector<float>({x + float(w.rank())}); };
    tensor_list ts{v(1), v(2)};
    pg.allreduce_coalesced(ts, {{.op = reduce_op::MAX}})
        .wait();  // c10d's AllreduceCoalescedOptions
    CHECK(ts[0].to_vector<float>()[0] == 2.f);
    pg.allreduce_coalesced(ts, {.op = reduce_op::MIN}).wait();  // allreduce_options' fields
    CHECK(ts[1].to_vector<float>()[0] == 3.f);
    pg.allreduce_coalesced(ts, {}).wait();
    pg.allreduce_coalesced(ts).wait();
    CHECK(ts[0].to_vector<float>()[0] == 8.f);
    allreduce_options plain{.op = reduce_op::MAX, .timeout = 10s};
    pg.allreduce_coalesced(ts, plain).wait();
    allreduce_coalesced_options coalesced;
    coalesced.op = reduce_op::MIN;
    pg.allreduce_coalesced(ts, coalesced).wait();
    CHECK(ts[0].to_vector<float>()[0] == 8.f);
    // c10d's AllreduceCoalescedOptions is an AllreduceOptions.
    const allreduce_options& as_base = coalesced;
    CHECK(as_base.op == reduce_op::MIN);
  });
}

TEST_CASE("the collectives' shorthands and option forms") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    const int r = w.rank();
    auto t = tensor::from_vector<float>({float(r)});
    pg.allreduce(t).wait();
    pg.allreduce(t, reduce_op::MAX).wait();
    pg.allreduce(t, {.op = reduce_op::MIN, .timeout = 10s}).wait();
    pg.allreduce(tensor_list{t}, {}).wait();
    CHECK(t.to_vector<float>()[0] == 2.f);
    pg.broadcast(t, 1).wait();
    pg.broadcast(t, {.root_rank = 0, .timeout = 10s}).wait();
    pg.reduce(t, 0, reduce_op::SUM).wait();
    pg.reduce(t, {.op = reduce_op::MAX, .root_rank = 1}).wait();
    pg.barrier().wait();
    pg.barrier({.timeout = 10s}).wait();
    pg.monitored_barrier({.timeout = 10s, .wait_all_ranks = true}).wait();
    auto m = tensor::from_vector<int>({7});
    if (r == 0) {
      pg.send(m, 1, 3).wait();
      pg.send(m, 1, {.tag = 4, .timeout = 10s}).wait();
    } else {
      pg.recv(m, 0, 3).wait();
      pg.recv(m, 0, {.tag = 4}).wait();
    }
    CHECK(m.to_vector<int>()[0] == 7);
  });
}

TEST_CASE("README: a large run with its own timeout") {
  troupe::testing::run_options o;
  o.timeout = std::chrono::minutes(5);  // 1024 threads take turns on 2 CPUs
  troupe::testing::run_ranks(
      8,
      [](troupe::world& w) {
        auto t = troupe::tensor::from_vector<float>({1.0f});
        w.default_group().allreduce(t).wait();  // 8.0 on every rank
        CHECK(t.to_vector<float>()[0] == 8.0f);
      },
      o);
}

TEST_CASE("README: simulated schedules and faults") {
  const troupe::test::inline_engine_env simulate_needs_it;
  auto program = [](troupe::world& w) {
    auto t = troupe::tensor::from_vector<int>({w.rank()});
    if (w.rank() == 0) {
      for (int i = 1; i < w.size(); ++i) w.default_group().recv_any_source(t).wait();
    } else {
      w.default_group().send(t, 0).wait();
    }
  };
  CHECK_FALSE(troupe::testing::find_failing_seed(3, program, 0, 20).has_value());
  troupe::testing::simulation_options o;
  o.seed = 7;
  o.faults = {{troupe::testing::fault::kill, 2, 1}};  // rank 2 dies at its 1st call
  CHECK_THROWS(troupe::testing::simulate(3, program, o));
}

TEST_CASE("README: recovery after a killed rank") {
  // The README's loop on the survivors, after rank 2's world went away.
  auto ws = troupe::test::make_worlds(3, 10s);
  ws[2].reset();
  std::vector<std::thread> survivors;
  for (int r : {0, 1})
    survivors.emplace_back([&, r] {
      auto& w = *ws[static_cast<std::size_t>(r)];
      std::shared_ptr<process_group> group(&w.default_group(), [](process_group*) {});
      float sum = 0;
      auto step = [&](process_group& g) {
        auto t = tensor::from_vector<float>({1.f});
        g.allreduce(t).wait();
        sum = t.to_vector<float>()[0];
      };
      try {
        step(*group);
      } catch (const troupe::error& e) {
        if (e.code() != troupe::errc::peer_failure) throw;
        group = w.shrink(*group);  // the survivors, renumbered
        step(*group);
      }
      CHECK(sum == 2.f);
    });
  for (auto& t : survivors) t.join();
}

TEST_CASE("README: the flight record and a trace") {
  const int n = 2;
  std::vector<std::vector<troupe::flight_entry>> ranks(n);
  troupe::testing::run_ranks(n, [&](troupe::world& w) {
    auto t = troupe::tensor::from_vector<float>({1.0f});
    w.default_group().allreduce(t).wait();
    ranks[w.rank()] = w.flight_record();  // every group of this rank, in issue order
  });
  CHECK(troupe::format_flight_record(ranks[0]).find("allreduce") != std::string::npos);
  const auto path = std::filesystem::temp_directory_path() / "troupe-api-styles-trace.json";
  troupe::write_chrome_trace(path.string(), ranks);  // open in ui.perfetto.dev
  CHECK(std::filesystem::file_size(path) > 0);
  std::filesystem::remove(path);
}

TEST_CASE("the version the headers carry is the library's") {
  CHECK(std::string(library_version()) == TROUPE_VERSION);
  CHECK(TROUPE_VERSION_NUMBER ==
        TROUPE_VERSION_MAJOR * 10000 + TROUPE_VERSION_MINOR * 100 + TROUPE_VERSION_PATCH);
}
