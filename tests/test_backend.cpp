// Backends: parsing of backend strings, the registry, a user-written backend
// (PyTorch's DummyProcessGroup) and dispatch by device type.

#include <doctest/doctest.h>
#include "check_error.hpp"

#include <algorithm>
#include <initializer_list>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/backend.hpp"
#include "troupe/error.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using troupe::test::check_error;

namespace {

void check_bad_config(const std::string& spec, std::string_view why) {
  CAPTURE(spec);
  check_error([&] { backend_config c{spec}; }, errc::invalid_argument, {"'" + spec + "'", why});
}

/// PyTorch's DummyProcessGroup: allreduce adds 2, broadcast adds 1, nothing
/// else is supported. It never communicates.
class dummy_backend final : public backend {
 public:
  explicit dummy_backend(const backend_context& ctx) : backend(ctx), ctx_(ctx) {}
  std::string name() const override { return "dummy"; }

  work allreduce(tensor_list& ts, const allreduce_options&) override {
    add(ts, 2.0f);
    return work::completed("allreduce", group_name(), ts);
  }
  work broadcast(tensor_list& ts, const broadcast_options&) override {
    add(ts, 1.0f);
    return work::completed("broadcast", group_name(), ts);
  }
  /// Takes a batch whole (as NCCL must), counting its ops.
  work batch_isend_irecv(std::vector<p2p_op>& ops) override {
    batched += static_cast<int>(ops.size());
    return work::completed("batch_isend_irecv", group_name(), {});
  }
  const backend_context& context() const { return ctx_; }
  int batched = 0;

 private:
  static void add(tensor_list& ts, float x) {
    for (auto& t : ts) {
      auto* p = t.data_as<float>();
      for (std::int64_t i = 0; i < t.numel(); ++i) p[i] += x;
    }
  }
  backend_context ctx_;
};

/// Registers the dummy backend under `name` once per process.
void register_dummy(const std::string& name) {
  static std::mutex mtx;
  static std::vector<std::string> done;
  std::lock_guard<std::mutex> g{mtx};
  if (std::find(done.begin(), done.end(), name) != done.end()) return;
  register_backend(name, [](const backend_context& ctx) -> std::shared_ptr<backend> {
    return std::make_shared<dummy_backend>(ctx);
  });
  done.push_back(name);
}

testing::run_options with_backend(std::string b) {
  testing::run_options o;
  o.backend = std::move(b);
  o.timeout = std::chrono::seconds(20);
  return o;
}

}  // namespace

// -- backend strings ------------------------------------------------------------------------

TEST_CASE("backend_config: a single name expands to every device it registered") {
  backend_config c{"actor"};
  CHECK(c.to_string() == "cpu:actor,cuda:actor");
  REQUIRE(c.entries().size() == 2);
  CHECK(c.backend_for(device_type::cpu) == "actor");
  CHECK(c.backend_for(device_type::cuda) == "actor");
}

TEST_CASE("backend_config: a per-device string is kept as given") {
  backend_config c{"cpu:actor,cuda:nccl"};
  CHECK(c.to_string() == "cpu:actor,cuda:nccl");
  CHECK(c.backend_for(device_type::cpu) == "actor");
  CHECK(c.backend_for(device_type::cuda) == "nccl");
  backend_config only_cpu{"cpu:actor"};
  CHECK(only_cpu.to_string() == "cpu:actor");
  CHECK(only_cpu.backend_for(device_type::cuda).empty());
}

TEST_CASE("backend_config: a single name registered for cpu only has no cuda entry") {
  register_dummy("dummy_test");
  backend_config c{"dummy_test"};
  CHECK(c.to_string() == "cpu:dummy_test");
  CHECK(c.backend_for(device_type::cuda).empty());
}

TEST_CASE("backend_config rejects a trailing comma") {
  check_bad_config("cpu:actor,", "trailing comma");
  check_bad_config("cpu:actor,cuda:actor,", "trailing comma");
}

TEST_CASE("backend_config rejects a repeated device") {
  check_bad_config("cpu:actor,cpu:actor", "'cpu' appears twice");
  check_bad_config("cuda:actor,cpu:actor,cuda:nccl", "'cuda' appears twice");
}

TEST_CASE("backend_config rejects an unknown device") {
  check_bad_config("tpu:actor", "unknown device 'tpu'");
  check_bad_config("cpu:actor,xla:actor", "unknown device 'xla'");
}

TEST_CASE("backend_config rejects an empty entry") {
  check_bad_config("cpu:actor,,cuda:actor", "empty entry");
  check_bad_config(",cpu:actor", "empty entry");
}

TEST_CASE("backend_config rejects the empty string") {
  check_error([] { backend_config c{""}; }, errc::invalid_argument,
              {"invalid backend string ''", "empty"});
}

TEST_CASE("backend_config rejects other malformed strings") {
  check_bad_config("cpu:", "names no backend");
  check_bad_config("cpu:actor,cuda", "no device prefix");
  check_bad_config("actor,gloo", "device prefixes");
  check_bad_config("no_such_backend", "not registered");
}

// -- the registry ------------------------------------------------------------------------------

TEST_CASE("is_backend_available knows the built-in actor backend") {
  CHECK(is_backend_available("actor"));
  CHECK_FALSE(is_backend_available("no_such_backend"));
  CHECK_FALSE(is_backend_available(""));
  auto names = available_backends();
  CHECK(std::find(names.begin(), names.end(), "actor") != names.end());
}

TEST_CASE("register_backend makes a backend available") {
  register_dummy("dummy_test");
  CHECK(is_backend_available("dummy_test"));
  auto names = available_backends();
  CHECK(std::find(names.begin(), names.end(), "dummy_test") != names.end());
}

TEST_CASE("register_backend rejects a name registered twice") {
  register_dummy("dummy_test");
  auto creator = [](const backend_context& ctx) -> std::shared_ptr<backend> {
    return std::make_shared<dummy_backend>(ctx);
  };
  check_error([&] { register_backend("dummy_test", creator); }, errc::invalid_argument,
              {"register_backend", "'dummy_test'", "already registered"});
  check_error([&] { register_backend("actor", creator); }, errc::invalid_argument,
              {"'actor'", "already registered"});
}

TEST_CASE("register_backend rejects bad names, creators and device lists") {
  auto creator = [](const backend_context& ctx) -> std::shared_ptr<backend> {
    return std::make_shared<dummy_backend>(ctx);
  };
  check_error([&] { register_backend("", creator); }, errc::invalid_argument,
              {"register_backend", "invalid backend name"});
  check_error([&] { register_backend("a:b", creator); }, errc::invalid_argument,
              {"invalid backend name 'a:b'"});
  check_error([&] { register_backend("a,b", creator); }, errc::invalid_argument,
              {"invalid backend name 'a,b'"});
  check_error([&] { register_backend("no_creator_test", nullptr); }, errc::invalid_argument,
              {"no creator", "no_creator_test"});
  check_error([&] { register_backend("no_devices_test", creator, {}); }, errc::invalid_argument,
              {"no device types", "no_devices_test"});
  CHECK_FALSE(is_backend_available("no_creator_test"));
  CHECK_FALSE(is_backend_available("no_devices_test"));
}

// -- a user-written backend ----------------------------------------------------------------

TEST_CASE("a user-written backend runs the calls it implements") {
  register_dummy("dummy_test");
  testing::run_ranks(
      2,
      [](world& w) {
        auto& pg = w.default_group();
        auto& b = pg.get_backend(device_type::cpu);
        CHECK(b.name() == "dummy");
        CHECK(b.rank() == w.rank());
        CHECK(b.size() == 2);
        CHECK(b.group_name() == "default");
        auto& ctx = dynamic_cast<dummy_backend&>(b).context();
        CHECK(ctx.global_ranks == std::vector<int>{0, 1});
        CHECK(ctx.store != nullptr);
        CHECK(ctx.device == device_type::cpu);

        auto t = tensor::from_vector<float>({0.0f, 1.0f, 2.0f});
        pg.allreduce(t).wait();
        CHECK(t.to_vector<float>() == std::vector<float>{2.0f, 3.0f, 4.0f});
        auto u = tensor::from_vector<float>({5.0f});
        auto wk = pg.broadcast(u, 1);
        CHECK(wk.is_completed());
        CHECK(wk.op_name() == "broadcast");
        wk.wait();
        CHECK(u.to_vector<float>()[0] == 6.0f);
        CHECK(pg.sequence_number() == 0);  // the base class's default
      },
      with_backend("dummy_test"));
}

TEST_CASE("batch_isend_irecv hands the whole batch to the backend of its device") {
  register_dummy("dummy_test");
  testing::run_ranks(
      2,
      [](world& w) {
        auto& pg = w.default_group();
        auto a = tensor::from_vector<float>({1.0f}), b = tensor::zeros({1}, dtype::float32);
        const int peer = 1 - w.rank();
        pg.batch_isend_irecv({{p2p_op::isend, a, peer}, {p2p_op::irecv, b, peer}}).wait();
        CHECK(dynamic_cast<dummy_backend&>(pg.get_backend(device_type::cpu)).batched == 2);
      },
      with_backend("dummy_test"));
}

TEST_CASE("a group with a backend for cuda alone runs barrier on it (as ProcessGroupNCCL)") {
  static std::once_flag once;
  std::call_once(once, [] {
    register_backend("dummy_cuda_only",
                     [](const backend_context& ctx) -> std::shared_ptr<backend> {
                       return std::make_shared<dummy_backend>(ctx);
                     },
                     {device_type::cuda});
  });
  testing::run_ranks(
      1,
      [](world& w) {
        auto& pg = w.default_group();
        CHECK(pg.sequence_number() == 0);
        check_error([&] { pg.barrier(); }, errc::backend,
                    {"backend 'dummy'", "does not support barrier"});
      },
      with_backend("dummy_cuda_only"));
}

TEST_CASE("a user-written backend rejects calls it does not implement") {
  register_dummy("dummy_test");
  testing::run_ranks(
      1,
      [](world& w) {
        auto& pg = w.default_group();
        auto t = tensor::from_vector<float>({1.0f});
        check_error([&] { pg.barrier(); }, errc::backend,
                    {"backend 'dummy'", "does not support barrier"});
        check_error([&] { pg.reduce(t, 0); }, errc::backend, {"does not support reduce"});
        auto out = tensor::empty({1}, dtype::float32);
        check_error([&] { pg.allgather_into_tensor(out, t); }, errc::backend,
                    {"does not support allgather_into_tensor"});
      },
      with_backend("dummy_test"));
}

TEST_CASE("new_group can use another backend than the world") {
  register_dummy("dummy_test");
  testing::run_ranks(2, [](world& w) {
    new_group_options o;
    o.backend = "dummy_test";
    auto g = w.new_group({0, 1}, o);
    CHECK(g->get_backend(device_type::cpu).name() == "dummy");
    auto t = tensor::from_vector<float>({1.0f});
    g->allreduce(t).wait();
    CHECK(t.to_vector<float>()[0] == 3.0f);
    w.default_group().allreduce(t).wait();  // the default group still runs the actor backend
    CHECK(t.to_vector<float>()[0] == 6.0f);
  });
}

// -- dispatch by device -------------------------------------------------------------------------

TEST_CASE("per-device dispatch sends cpu tensors to the cpu backend") {
  register_dummy("dummy_test2");
  testing::run_ranks(
      2,
      [](world& w) {
        auto& pg = w.default_group();
        CHECK(pg.get_backend(device_type::cpu).name() == "dummy");
        CHECK(pg.get_backend(device_type::cuda).name() == "actor");
        auto t = tensor::from_vector<float>({10.0f});
        pg.allreduce(t).wait();
        CHECK(t.to_vector<float>()[0] == 12.0f);  // the dummy, not a sum over ranks
      },
      with_backend("cpu:dummy_test2,cuda:actor"));
}

TEST_CASE("a group without a cuda backend rejects cuda tensors") {
  testing::run_ranks(
      1,
      [](world& w) {
        auto& pg = w.default_group();
        check_error([&] { (void)pg.get_backend(device_type::cuda); }, errc::backend,
                    {"no backend for device type cuda"});
        // Only metadata says cuda: the call is rejected before the memory is touched.
        float host[4] = {1, 2, 3, 4};
        auto t = tensor::from_blob(host, {4}, dtype::float32, device::cuda(0));
        check_error([&] { pg.allreduce(t); }, errc::backend,
                    {"allreduce", "default", "no backend for device type cuda"});
        check_error([&] { pg.broadcast(t, 0); }, errc::backend,
                    {"broadcast", "no backend for device type cuda"});
        // cpu tensors still work.
        auto c = tensor::from_vector<float>({1.0f});
        pg.allreduce(c).wait();
        CHECK(c.to_vector<float>()[0] == 1.0f);
      },
      with_backend("cpu:actor"));
}
