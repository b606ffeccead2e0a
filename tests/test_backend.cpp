// Backends: the registry, a user-written backend (PyTorch's
// DummyProcessGroup) and dispatch by device type (backend strings:
// test_backend_config.cpp).

#include <doctest/doctest.h>
#include "check_error.hpp"

#include <algorithm>
#include <chrono>
#include <initializer_list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "troupe/backend.hpp"
#include "troupe/error.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using troupe::test::check_error;

namespace {

/// PyTorch's DummyProcessGroup, the calls most tests need: allreduce adds 2,
/// broadcast adds 1, a batch of sends and receives is counted; nothing else
/// is supported. It never communicates.
class dummy_backend : public backend {
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

 protected:
  static void add(tensor_list& ts, float x) {
    for (auto& t : ts) {
      auto* p = t.data_as<float>();
      for (std::int64_t i = 0; i < t.numel(); ++i) p[i] += x;
    }
  }

 private:
  backend_context ctx_;
};

/// PyTorch's DummyProcessGroup (test_c10d_common.py) in full: also allgather
/// copies the input into every output, reduce_scatter copies this rank's
/// input, barrier counts the ranks in the store, send adds 1 and recv adds 2.
class full_dummy_backend final : public dummy_backend {
 public:
  using dummy_backend::dummy_backend;

  work allgather(std::vector<tensor_list>& outputs, tensor_list& inputs,
                 const allgather_options&) override {
    for (std::size_t i = 0; i < inputs.size(); ++i)
      for (auto& out : outputs[i]) out.copy_from(inputs[i]);
    return work::completed("allgather", group_name(), {});
  }
  work reduce_scatter(tensor_list& outputs, std::vector<tensor_list>& inputs,
                      const reduce_scatter_options&) override {
    for (std::size_t i = 0; i < outputs.size(); ++i)
      outputs[i].copy_from(inputs[i][static_cast<std::size_t>(rank())]);
    return work::completed("reduce_scatter", group_name(), outputs);
  }
  /// The seed's barrier: every other rank adds 1 to a counter in the store;
  /// rank 0 waits until they all did.
  work barrier(const barrier_options&) override {
    const std::string key = "TEST:DummyProcessGroup:barrier";
    auto& store = *context().store;
    if (rank() == 0) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (store.add(key, 0) < size() - 1) {
        if (std::chrono::steady_clock::now() > deadline)
          throw error(errc::timeout, "dummy barrier: the other ranks did not arrive");
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } else {
      store.add(key, 1);
    }
    return work::completed("barrier", group_name(), {});
  }
  work send(tensor_list& ts, int, const p2p_options&) override {
    add(ts, 1.0f);
    return work::completed("send", group_name(), ts);
  }
  work recv(tensor_list& ts, int, const p2p_options&) override {
    add(ts, 2.0f);
    return work::completed("recv", group_name(), ts);
  }
  /// gather and scatter in their list forms only, recording the lists'
  /// lengths (lists, tensors in the first, the other side's tensors):
  /// gather copies the input into every output, scatter copies the root's
  /// input for this rank (elsewhere adds 1).
  work gather(std::vector<tensor_list>& outputs, tensor_list& inputs,
              const gather_options&) override {
    handed = {outputs.size(), outputs.empty() ? 0 : outputs[0].size(), inputs.size()};
    for (auto& list : outputs)
      for (auto& t : list) t.copy_from(inputs[0]);
    return work::completed("gather", group_name(), {});
  }
  work scatter(tensor_list& outputs, std::vector<tensor_list>& inputs,
               const scatter_options&) override {
    handed = {inputs.size(), inputs.empty() ? 0 : inputs[0].size(), outputs.size()};
    if (inputs.empty())
      add(outputs, 1.0f);
    else
      outputs[0].copy_from(inputs[0][static_cast<std::size_t>(rank())]);
    return work::completed("scatter", group_name(), outputs);
  }
  std::vector<std::size_t> handed;
};

/// Registers `Backend` under `name` once per process (for cpu and cuda unless
/// `devices` says otherwise).
template <class Backend = dummy_backend>
void register_dummy(const std::string& name,
                    std::vector<device_type> devices = {device_type::cpu, device_type::cuda}) {
  static std::mutex mtx;
  static std::vector<std::string> done;
  std::lock_guard<std::mutex> g{mtx};
  if (std::find(done.begin(), done.end(), name) != done.end()) return;
  register_backend(
      name,
      [](const backend_context& ctx) -> std::shared_ptr<backend> {
        return std::make_shared<Backend>(ctx);
      },
      std::move(devices));
  done.push_back(name);
}

testing::run_options with_backend(std::string b) {
  testing::run_options o;
  o.backend = std::move(b);
  o.timeout = std::chrono::seconds(20);
  return o;
}

}  // namespace

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

TEST_CASE("backend names ignore letter case") {
  register_dummy("dummy_test");
  CHECK(is_backend_available("DUMMY_TEST"));
  CHECK(is_backend_available("Dummy_Test"));
  CHECK(is_backend_available("ACTOR"));
  auto creator = [](const backend_context& ctx) -> std::shared_ptr<backend> {
    return std::make_shared<dummy_backend>(ctx);
  };
  check_error([&] { register_backend("DUMMY_TEST", creator); }, errc::invalid_argument,
              {"'DUMMY_TEST'", "already registered"});
  register_dummy("MixedCase_Test");
  auto names = available_backends();
  CHECK(std::find(names.begin(), names.end(), "mixedcase_test") != names.end());
  testing::run_ranks(
      1, [](world& w) { CHECK(w.default_group().get_backend(device_type::cpu).name() == "dummy"); },
      with_backend("MIXEDCASE_TEST"));
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

TEST_CASE("c10d's DummyProcessGroup as a custom backend: collectives and send/recv") {
  register_dummy<full_dummy_backend>("full_dummy_test");
  for (int n : {2, 3})
    testing::run_ranks(
        n,
        [n](world& w) {
          auto& pg = w.default_group();
          const int r = w.rank();
          // all_gather copies the input into every output.
          auto in = tensor::from_vector<float>({7.0f, 7.0f, 7.0f, 7.0f}).view({2, 2});
          tensor_list outs;
          for (int q = 0; q < n; ++q) outs.push_back(tensor::zeros({2, 2}, dtype::float32));
          pg.allgather(outs, in).wait();
          for (auto& o : outs) CHECK(o.to_vector<float>() == std::vector<float>(4, 7.0f));
          // all_reduce adds 2, broadcast adds 1 (async, then waited).
          auto t = tensor::from_vector<float>({7.0f, 7.0f});
          pg.allreduce(t).wait();
          CHECK(t.to_vector<float>() == std::vector<float>(2, 9.0f));
          auto z = tensor::zeros({2, 2}, dtype::float32);
          pg.broadcast(z, 0).wait();
          CHECK(z.to_vector<float>() == std::vector<float>(4, 1.0f));
          // reduce_scatter copies this rank's input.
          tensor_list ins;
          for (int q = 0; q < n; ++q)
            ins.push_back(tensor::from_vector<float>({float(q), float(q)}));
          auto out = tensor::zeros({2}, dtype::float32);
          pg.reduce_scatter(out, ins).wait();
          CHECK(out.to_vector<float>() == std::vector<float>(2, float(r)));
          // send adds 1, recv adds 2; sending to oneself is refused.
          auto s = tensor::zeros({2}, dtype::float32);
          pg.send(s, (r + 1) % n).wait();
          CHECK(s.to_vector<float>() == std::vector<float>(2, 1.0f));
          check_error([&] { pg.send(s, r); }, errc::invalid_argument, {"send"});
          auto v = tensor::zeros({2}, dtype::float32);
          pg.recv(v, (r + 1) % n).wait();
          CHECK(v.to_vector<float>() == std::vector<float>(2, 2.0f));
          // barrier through the store's counter.
          pg.barrier().wait();
        },
        with_backend("full_dummy_test"));
}

TEST_CASE("gather and scatter of one tensor reach a backend that has only their list forms") {
  register_dummy<full_dummy_backend>("full_dummy_test");
  for (int n : {1, 2, 3})
    testing::run_ranks(
        n,
        [n](world& w) {
          auto& pg = w.default_group();
          auto& b = dynamic_cast<full_dummy_backend&>(pg.get_backend(device_type::cpu));
          const int r = w.rank();
          const int root = n - 1;
          const auto un = static_cast<std::size_t>(n);
          // gather: the root's one list of n outputs, none elsewhere; one input.
          auto in = tensor::from_vector<float>({float(r), 5.0f});
          tensor_list outs;
          if (r == root)
            for (int q = 0; q < n; ++q) outs.push_back(tensor::zeros({2}, dtype::float32));
          pg.gather(outs, in, {.root_rank = root}).wait();
          CHECK(b.handed == (r == root ? std::vector<std::size_t>{1, un, 1}
                                       : std::vector<std::size_t>{0, 0, 1}));
          for (auto& o : outs) CHECK(o.to_vector<float>() == std::vector<float>{float(r), 5.0f});
          // scatter: the root's one list of n inputs, none elsewhere; one output.
          tensor_list ins;
          if (r == root)
            for (int q = 0; q < n; ++q) ins.push_back(tensor::from_vector<float>({float(10 + q)}));
          auto out = tensor::zeros({1}, dtype::float32);
          auto wk = pg.scatter(out, ins, {.root_rank = root});
          CHECK(wk.op_name() == "scatter");
          wk.wait();
          CHECK(b.handed == (r == root ? std::vector<std::size_t>{1, un, 1}
                                       : std::vector<std::size_t>{0, 0, 1}));
          CHECK(out.to_vector<float>()[0] == (r == root ? float(10 + r) : 1.0f));
          // Checked before the backend sees them, as the list forms are.
          check_error([&] { pg.scatter(out, ins, {.root_rank = n}); }, errc::invalid_argument,
                      {"scatter", "root_rank"});
          if (r != root)
            check_error([&] { pg.gather({in}, in, {.root_rank = root}); }, errc::invalid_argument,
                        {"gather", "must be empty on non-root rank"});
        },
        with_backend("full_dummy_test"));
}

TEST_CASE("backend types: get_backend(type), set_backend, the backend name") {
  register_dummy("dummy_test");
  testing::run_ranks(1, [](world& w) {
    auto& pg = w.default_group();
    CHECK(pg.get_backend_type() == backend_type::actor);
    CHECK(pg.backend_name() == "actor");
    CHECK(&pg.get_backend(backend_type::actor) == &pg.get_backend(device_type::cpu));
    check_error([&] { (void)pg.get_backend(backend_type::nccl); }, errc::backend,
                {"Could not find backend type nccl."});
    check_error([&] { (void)pg.get_backend(backend_type::custom); }, errc::backend,
                {"Could not find backend type custom."});
    // Install a user-written backend for cuda: dispatch and lookup by type see it.
    backend_context ctx;
    ctx.rank = 0;
    ctx.size = 1;
    ctx.group_name = pg.name();
    auto mine = std::make_shared<dummy_backend>(ctx);
    pg.set_backend(device_type::cuda, backend_type::custom, mine);
    CHECK(&pg.get_backend(device_type::cuda) == mine.get());
    CHECK(&pg.get_backend(backend_type::custom) == mine.get());
    CHECK(pg.backend_name() == "cpu:actor,cuda:dummy");
    CHECK(pg.get_backend_type() == backend_type::actor);  // the cpu's stays the default
    check_error([&] { pg.set_backend(device_type::cuda, backend_type::custom, nullptr); },
                errc::invalid_argument, {"set_backend", "null backend"});
    CHECK(backend_type_of("NCCL") == backend_type::nccl);
    CHECK(backend_type_of("gloo") == backend_type::custom);
    CHECK(backend_type_of("") == backend_type::undefined);
    CHECK(std::string(to_string(backend_type::custom)) == "custom");
  });
  testing::run_ranks(
      1,
      [](world& w) {
        CHECK(w.default_group().get_backend_type() == backend_type::custom);
        CHECK(w.default_group().backend_name() == "dummy");
      },
      with_backend("dummy_test"));
}

TEST_CASE("group name and description setters; the world still finds a renamed group") {
  testing::run_ranks(2, [](world& w) {
    auto g = w.new_group({0, 1});
    g->set_name("trainers");
    g->set_description("the ranks that train");
    CHECK(g->name() == "trainers");
    CHECK(g->description() == "the ranks that train");
    CHECK(w.get_group_rank(*g, 1) == 1);
    CHECK(w.get_process_group_ranks(*g) == std::vector<int>{0, 1});
    auto t = tensor::from_vector<float>({1.0f});
    g->allreduce(t).wait();
    CHECK(t.to_vector<float>()[0] == 2.0f);
    check_error([&] { g->set_name(""); }, errc::invalid_argument, {"set_name", "empty"});
    w.destroy_process_group(g);
    check_error([&] { w.get_group_rank(*g, 0); }, errc::group, {"'trainers'", "not registered"});
  });
}

TEST_CASE("a group bound to a device") {
  testing::run_ranks(1, [](world& w) {
    auto& pg = w.default_group();
    CHECK_FALSE(pg.bound_device().has_value());
    pg.set_bound_device(device::cuda(0));
    REQUIRE(pg.bound_device().has_value());
    CHECK(*pg.bound_device() == device::cuda(0));
    check_error(
        [&] {
          pg.set_bound_device(device{device_type::cuda, -1});
        },
        errc::invalid_argument, {"set_bound_device", "must have an index"});
    CHECK(*pg.bound_device() == device::cuda(0));
    pg.set_bound_device(std::nullopt);
    CHECK_FALSE(pg.bound_device().has_value());
  });
}

TEST_CASE("sequence numbers for the group, and a backend without them") {
  register_dummy("dummy_test");
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    pg.set_sequence_number_for_group();
    const auto start = pg.get_sequence_number_for_group();
    for (int i = 1; i <= 3; ++i) {
      pg.barrier().wait();
      CHECK(pg.get_sequence_number_for_group() == start + i);
    }
  });
  testing::run_ranks(
      1,
      [](world& w) {
        auto& pg = w.default_group();
        check_error([&] { pg.set_sequence_number_for_group(); }, errc::backend,
                    {"ProcessGroup dummy does not yet support sequence numbers."});
        check_error([&] { (void)pg.get_sequence_number_for_group(); }, errc::backend,
                    {"ProcessGroup dummy does not yet support sequence numbers."});
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
