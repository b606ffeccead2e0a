// The ProcessGroup rows of c10d's ProcessGroup.hpp beyond the calls: the
// ids of a group and of its backends (getID, getBackendID), the device
// types that have a backend (getDeviceTypes), the default backend
// (getDefaultBackend), whether a completion hook is registered (hasHooks),
// the default timeout (kProcessGroupDefaultTimeout) and barrier's
// device_ids.

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "check_error.hpp"
#include "troupe/backend.hpp"
#include "troupe/error.hpp"
#include "troupe/launch.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::test::check_error;

namespace {

/// A backend that keeps the options of its last barrier and completes it at once.
class recording_backend final : public backend {
 public:
  explicit recording_backend(const backend_context& ctx) : backend(ctx) {}
  std::string name() const override { return "recording"; }
  work barrier(const barrier_options& o) override {
    last_barrier = o;
    ++barriers;
    return work::completed("barrier", group_name(), {});
  }
  barrier_options last_barrier;
  int barriers = 0;
};

/// Registers recording_backend as "recording" for `devices` under `name`, once.
void register_recording(const std::string& name, std::vector<device_type> devices) {
  static std::mutex mtx;
  static std::set<std::string> done;
  std::lock_guard<std::mutex> g{mtx};
  if (!done.insert(name).second) return;
  register_backend(
      name,
      [](const backend_context& ctx) -> std::shared_ptr<backend> {
        return std::make_shared<recording_backend>(ctx);
      },
      std::move(devices));
}

testing::run_options with_backend(std::string b) {
  testing::run_options o;
  o.backend = std::move(b);
  o.timeout = 20s;
  return o;
}

/// Worlds of `n` ranks on threads, made with world's own defaults (no timeout
/// given); `fn(world&)` runs on each, all worlds stay until every rank returned.
template <class F>
void with_default_worlds(int n, F fn) {
  auto store = std::make_shared<hash_store>();
  std::vector<std::thread> ts;
  std::mutex mtx;
  std::string failure;
  std::atomic<int> left{n};
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        world w{"actor", store, r, n};
        try {
          fn(w);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> g{mtx};
          failure = e.what();
        }
        // Every world stays until its peers are done with it.
        left.fetch_sub(1);
        while (left.load() > 0) std::this_thread::sleep_for(1ms);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> g{mtx};
        failure = e.what();
        left.fetch_sub(1);
      }
    });
  for (auto& t : ts) t.join();
  CHECK_MESSAGE(failure.empty(), failure);
}

}  // namespace

// -- getID, getBackendID ----------------------------------------------------------------------

TEST_CASE("get_id: one id per group object, the same for its whole life") {
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const auto id = pg.get_id();
      auto sub = w.new_group({0});
      auto all = w.new_group(n == 1 ? std::vector<int>{0} : std::vector<int>{0, 1});
      CHECK(id != 0);
      CHECK(sub->get_id() != id);
      CHECK(all->get_id() != id);
      CHECK(all->get_id() != sub->get_id());  // a non-member's group has one too
      auto t = tensor::from_vector<float>({1.0f});
      pg.allreduce(t).wait();
      pg.set_name("renamed" + std::to_string(w.rank()));
      CHECK(pg.get_id() == id);  // stable across calls and renames
    });
  }
  // Ranks of one process hold group objects of their own.
  std::mutex mtx;
  std::set<std::int64_t> ids;
  testing::run_ranks(4, [&](world& w) {
    std::lock_guard<std::mutex> g{mtx};
    ids.insert(w.default_group().get_id());
  });
  if (!launched_by_launcher()) CHECK(ids.size() == 4);
}

TEST_CASE("get_backend_id: one backend serving two devices has one id; two backends differ") {
  register_recording("recording_cuda", {device_type::cuda});
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    const auto cpu = pg.get_backend_id(device_type::cpu);
    CHECK(cpu == pg.get_backend_id(device_type::cuda));  // "actor": one instance for both
    CHECK(cpu == pg.get_backend_id(backend_type::actor));
    CHECK(cpu == reinterpret_cast<std::intptr_t>(&pg.get_backend(device_type::cpu)));
    CHECK(cpu != pg.get_id());
    auto g = w.new_group({0, 1});
    CHECK(g->get_backend_id(backend_type::actor) != cpu);  // each group its own backend
    auto t = tensor::from_vector<float>({1.0f});
    pg.allreduce(t).wait();
    CHECK(pg.get_backend_id(device_type::cpu) == cpu);
    check_error([&] { (void)pg.get_backend_id(backend_type::nccl); }, errc::backend,
                {"Could not find backend type nccl."});
  });
  testing::run_ranks(
      1,
      [](world& w) {
        auto& pg = w.default_group();
        const auto cpu = pg.get_backend_id(device_type::cpu);
        const auto cuda = pg.get_backend_id(device_type::cuda);
        CHECK(cpu != cuda);
        CHECK(cuda == pg.get_backend_id(backend_type::custom));
        CHECK(cpu == pg.get_backend_id(backend_type::actor));
      },
      with_backend("cpu:actor,cuda:recording_cuda"));
  testing::run_ranks(
      1,
      [](world& w) {
        check_error([&] { (void)w.default_group().get_backend_id(device_type::cuda); },
                    errc::backend, {"has no backend for device type cuda"});
      },
      with_backend("cpu:actor"));
}

// -- getDeviceTypes, getDefaultBackend ------------------------------------------------------

TEST_CASE("get_device_types lists the device types that have a backend") {
  register_recording("recording_cuda", {device_type::cuda});
  using types = std::vector<device_type>;
  testing::run_ranks(2, [](world& w) {
    CHECK(w.default_group().get_device_types() == types{device_type::cpu, device_type::cuda});
    auto non_member = w.new_group({0});
    if (w.rank() == 1) CHECK(non_member->get_device_types().empty());
  });
  testing::run_ranks(
      1, [](world& w) { CHECK(w.default_group().get_device_types() == types{device_type::cpu}); },
      with_backend("cpu:actor"));
  testing::run_ranks(
      1,
      [](world& w) {
        CHECK(w.default_group().get_device_types() == types{device_type::cuda});
        CHECK(w.default_group().get_default_backend().name() == "recording");
      },
      with_backend("cuda:recording_cuda"));
  // A device whose backend is not registered here has none.
  testing::run_ranks(
      1,
      [](world& w) {
        CHECK(w.default_group().get_device_types() == types{device_type::cpu});
        // set_backend adds one.
        backend_context ctx;
        ctx.rank = 0;
        ctx.size = 1;
        w.default_group().set_backend(device_type::cuda, backend_type::custom,
                                      std::make_shared<recording_backend>(ctx));
        CHECK(w.default_group().get_device_types() == types{device_type::cpu, device_type::cuda});
      },
      with_backend("cpu:actor,cuda:no_such_backend"));
}

TEST_CASE("get_default_backend is the backend barrier runs on: the cpu's, else the only one") {
  register_recording("recording_cuda", {device_type::cuda});
  testing::run_ranks(
      1,
      [](world& w) {
        auto& pg = w.default_group();
        CHECK(&pg.get_default_backend() == &pg.get_backend(device_type::cpu));
        CHECK(&pg.get_default_backend() == &pg.get_backend(pg.get_backend_type()));
      },
      with_backend("cpu:actor,cuda:recording_cuda"));
  testing::run_ranks(
      1,
      [](world& w) {
        auto& pg = w.default_group();
        auto& rec = dynamic_cast<recording_backend&>(pg.get_default_backend());
        pg.barrier().wait();
        CHECK(rec.barriers == 1);
      },
      with_backend("cuda:recording_cuda"));
}

// -- hasHooks ---------------------------------------------------------------------------------

TEST_CASE("has_hooks: false until an on-completion hook is registered, true after") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    auto other = w.new_group({0, 1});
    CHECK_FALSE(pg.has_hooks());
    auto t = tensor::from_vector<float>({1.0f});
    pg.allreduce(t).wait();
    CHECK_FALSE(pg.has_hooks());  // calls and pending works are no hooks
    check_error([&] { pg.register_on_completion_hook({}); }, errc::invalid_argument,
                {"register_on_completion_hook", "empty"});
    CHECK_FALSE(pg.has_hooks());  // a refused registration leaves none
    // The hook stays with the group, which outlives this function (the
    // ranks' last barrier completes through it too): it shares what it counts.
    auto seen = std::make_shared<std::atomic<int>>(0);
    pg.register_on_completion_hook([seen](const work_info&) { ++*seen; });
    CHECK(pg.has_hooks());
    CHECK_FALSE(other->has_hooks());  // per group
    pg.allreduce(t).wait();
    pg.wait_for_pending_works();
    CHECK(pg.has_hooks());
    check_error([&] { pg.register_on_completion_hook([](const work_info&) {}); },
                errc::invalid_argument, {"already has an on-completion hook"});
    CHECK(pg.has_hooks());
  });
}

// -- the default timeout ----------------------------------------------------------------------

TEST_CASE("a world and its groups use 30 minutes when no timeout is given (c10d's default)") {
  CHECK(default_pg_timeout == std::chrono::minutes(30));
  CHECK(world_options{}.timeout == std::chrono::milliseconds(30 * 60 * 1000));
  CHECK_FALSE(new_group_options{}.timeout.has_value());
  with_default_worlds(2, [](world& w) {
    CHECK(w.timeout() == default_pg_timeout);
    CHECK(w.default_group().timeout() == default_pg_timeout);
    auto g = w.new_group({0, 1});
    CHECK(g->timeout() == default_pg_timeout);
    auto quick = w.new_group({0, 1}, {.timeout = 250ms});
    CHECK(quick->timeout() == 250ms);
    // Calls run under the group's timeout: a receive nobody sends to fails
    // at the 250 ms of its group, not at the world's 30 minutes.
    if (w.rank() == 0) {
      auto t = tensor::zeros({1}, dtype::float32);
      const auto start = std::chrono::steady_clock::now();
      check_error([&] { quick->recv(t, 1).wait(); }, errc::timeout, {"250 ms"});
      CHECK(std::chrono::steady_clock::now() - start < 60s);
      // The default group's call is still waiting when that one gave up.
      auto pending = g->recv(t, 1, 7);
      CHECK_THROWS_AS(pending.wait(300ms), error);
      CHECK_FALSE(pending.is_completed());
      g->abort("test over");
      CHECK_THROWS(pending.wait());
    }
  });
  // A world given a timeout hands it to the groups that name none.
  testing::run_ranks(2, [](world& w) {
    CHECK(w.timeout() == 60s);
    CHECK(w.default_group().timeout() == 60s);
    CHECK(w.new_group({0, 1})->timeout() == 60s);
  });
}

// -- barrier's device_ids ---------------------------------------------------------------------

TEST_CASE("barrier refuses device_ids that name no device of this process, or one twice") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    check_error([&] { pg.barrier({.device_ids = {-1}}); }, errc::invalid_argument,
                {"barrier: device_ids[0] -1 is negative"});
    check_error(
        [&] {
          pg.barrier({.device_ids = {0, 0}});
        },
        errc::invalid_argument, {"barrier: device_ids[1] 0 appears twice (also device_ids[0])"});
    const auto devices = cuda_device_count();
    check_error(
        [&] { pg.barrier({.device_ids = {devices}}); }, errc::invalid_argument,
        {"barrier: device_ids[0] " + std::to_string(devices), "names no device", cuda_status()});
    // Nothing was issued: the ranks still agree on every call.
    CHECK(pg.sequence_number() == 0);
    pg.barrier().wait();
    pg.barrier({.device_ids = {}}).wait();
    CHECK(pg.sequence_number() == 2);
  });
}

TEST_CASE("barrier hands valid device_ids to its backend") {
  register_recording("recording_all", {device_type::cpu, device_type::cuda});
  testing::run_ranks(
      1,
      [](world& w) {
        auto& pg = w.default_group();
        auto& rec = dynamic_cast<recording_backend&>(pg.get_default_backend());
        pg.barrier({.timeout = 5s}).wait();
        CHECK(rec.last_barrier.device_ids.empty());
        CHECK(rec.last_barrier.timeout == 5s);
        if (cuda_device_count() > 0) {  // the GPU suite runs the rest with a device
          pg.barrier({.device_ids = {0}}).wait();
          CHECK(rec.last_barrier.device_ids == std::vector<std::int64_t>{0});
        }
        CHECK(rec.barriers == (cuda_device_count() > 0 ? 2 : 1));
      },
      with_backend("recording_all"));
}
