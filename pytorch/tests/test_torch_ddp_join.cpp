// distributed_data_parallel::join with uneven inputs: 2 to 4 ranks with
// different numbers of batches (one none) end with the parameters and
// buffers torch 1.13's DDP under Join ended with on gloo
// (data/torch_ddp_reference.txt): gradients divided by the group's size or
// by the ranks still training, buffers from the highest rank still
// training, the final model from the highest of the last to join; also
// with find_unused_parameters; throw_on_early_termination throws on every
// rank; an exception in the loop leaves at once.

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <string>
#include <vector>

#include "troupe_torch/doctest.hpp"  // after the torch headers, before check_error.hpp

#include "check_error.hpp"
#include "ddp_test_support.hpp"
#include "troupe/testing.hpp"
#include "troupe_torch/distributed_data_parallel.hpp"

namespace {

/// The script's JoinNet: Linear 4 -> 8, BatchNorm1d(8), ReLU, Linear 8 -> 2,
/// and a Linear 2 -> 2 used on odd batches when asked.
struct JoinNetImpl : torch::nn::Module {
  torch::nn::Linear l1{nullptr}, l2{nullptr}, extra{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  bool use_extra = false;
  explicit JoinNetImpl(bool with_extra) {
    l1 = register_module("l1", torch::nn::Linear(4, 8));
    bn = register_module("bn", torch::nn::BatchNorm1d(8));
    l2 = register_module("l2", torch::nn::Linear(8, 2));
    if (with_extra) extra = register_module("extra", torch::nn::Linear(2, 2));
    ddp_test::init_params(*this, 7);
  }
  at::Tensor forward(const at::Tensor& x) {
    auto h = l2(torch::nn::functional::relu(bn(l1(x))));
    return use_extra ? extra(h) : h;
  }
};

struct join_scenario {
  std::string name;
  std::vector<int> batches;  // per rank
  bool divide_by_initial_world_size = true;
  bool find_unused = false;
  bool static_graph = false;
  bool micro_batches = false;  // each batch in two halves, the first under no_sync
};

void run(troupe::world& w, const join_scenario& s) {
  CAPTURE(s.name);
  auto& pg = w.default_group();
  const int r = w.rank();
  auto model = std::make_shared<JoinNetImpl>(s.find_unused);
  troupe_torch::ddp_options o;
  o.find_unused_parameters = s.find_unused;
  o.static_graph = s.static_graph;
  troupe_torch::distributed_data_parallel<JoinNetImpl> ddp{model, pg, o};
  troupe_torch::join_options jo;
  jo.divide_by_initial_world_size = s.divide_by_initial_world_size;
  ddp.join(
      [&] {
        for (int k = 0; k < s.batches[static_cast<std::size_t>(r)]; ++k) {
          auto g = ddp_test::gen(100 * r + k);
          const std::int64_t rows = s.micro_batches ? 4 : 3;
          auto x = at::randn({rows, 4}, g), y = at::randn({rows, 2}, g);
          model->use_extra = s.find_unused && k % 2 == 1;
          ddp_test::zero_grads(*model);
          if (s.micro_batches) {
            {
              auto guard = ddp.no_sync();
              torch::nn::functional::mse_loss(ddp.forward(x.narrow(0, 0, 2)), y.narrow(0, 0, 2))
                  .backward();
            }
            torch::nn::functional::mse_loss(ddp.forward(x.narrow(0, 2, 2)), y.narrow(0, 2, 2))
                .backward();
          } else {
            torch::nn::functional::mse_loss(ddp.forward(x), y).backward();
          }
          ddp_test::sgd(*model, 0.1);
        }
      },
      jo);
  CHECK(ddp.logging_data().join_uneven_inputs);
  CHECK(ddp.logging_data().ints_map().at("join_uneven_inputs") == 1);
  const auto want = ddp_test::reference_under("join." + s.name + ".");
  REQUIRE(!want.empty());
  auto ours = model->named_parameters();
  for (const auto& item : model->named_buffers()) ours.insert(item.key(), item.value());
  CHECK(ours.size() == want.size());
  for (const auto& [key, e] : want) {
    CAPTURE(key);
    REQUIRE(ours.contains(key));
    CHECK(at::allclose(ours[key].to(at::kFloat), e.tensor, 1e-5, 1e-6));
  }
}

}  // namespace

TEST_CASE("distributed_data_parallel::join ends where torch's Join ends with uneven inputs") {
  at::set_num_threads(1);
  troupe::testing::run_ranks(
      2,
      [](troupe::world& w) {
        run(w, {"n2", {2, 4}});
        run(w, {"n2_divide_by_training", {2, 4}, false});
        run(w, {"n2_static", {2, 4}, true, false, true});
        run(w, {"n2_no_sync", {2, 3}, true, false, false, true});
      },
      ddp_test::quick());
  troupe::testing::run_ranks(
      3,
      [](troupe::world& w) {
        run(w, {"n3", {3, 1, 0}});  // rank 2 has no batch at all
        run(w, {"n3_divide_by_training", {3, 1, 0}, false});
        run(w, {"n3_unused", {2, 3, 1}, true, true});
      },
      ddp_test::quick());
  troupe::testing::run_ranks(
      4,
      [](troupe::world& w) {
        run(w, {"n4", {1, 3, 2, 3}});
      },
      ddp_test::quick());
}

TEST_CASE("distributed_data_parallel::join: early termination, errors, disabled, one rank") {
  at::set_num_threads(1);
  troupe::testing::run_ranks(
      2,
      [](troupe::world& w) {
        auto& pg = w.default_group();
        const int r = w.rank();
        auto model = std::make_shared<JoinNetImpl>(false);
        troupe_torch::distributed_data_parallel<JoinNetImpl> ddp{model, pg};
        troupe_torch::join_options o;
        o.throw_on_early_termination = true;
        const auto& ref = ddp_test::reference();
        std::string what;
        try {
          ddp.join(
              [&] {
                for (int k = 0; k < (r == 0 ? 1 : 3); ++k) {
                  auto g = ddp_test::gen(100 * r + k);
                  auto x = at::randn({3, 4}, g), y = at::randn({3, 2}, g);
                  torch::nn::functional::mse_loss(ddp.forward(x), y).backward();
                }
              },
              o);
        } catch (const troupe::error& e) {
          CHECK(e.code() == troupe::errc::aborted);
          what = e.what();
        }
        // torch's words on each side.
        const auto& torch_says = ref.at("join.throw.rank" + std::to_string(r) + ".error").text;
        CHECK_MESSAGE(what.find(torch_says) != std::string::npos, what);

        // The group and the module go on: equal inputs, nobody joins early.
        o.throw_on_early_termination = false;
        ddp.join([&] { ddp.forward(at::ones({3, 4})).sum().backward(); }, o);

        // An exception from the loop leaves at once, on every rank alike.
        CHECK_THROWS_WITH_AS(ddp.join([] { throw std::runtime_error("out of data"); }),
                             "out of data", std::runtime_error);
        // Disabled: the loop alone.
        int ran = 0;
        troupe_torch::join_options off;
        off.enable = false;
        ddp.join([&] { ++ran; }, off);
        CHECK(ran == 1);
      },
      ddp_test::quick());
  troupe::testing::run_ranks(
      1,
      [](troupe::world& w) {
        auto model = std::make_shared<JoinNetImpl>(false);
        troupe_torch::distributed_data_parallel<JoinNetImpl> ddp{model, w.default_group()};
        ddp.join([&] { ddp.forward(at::ones({3, 4})).sum().backward(); });
        CHECK(ddp.logging_data().join_uneven_inputs);
      },
      ddp_test::quick());
}
