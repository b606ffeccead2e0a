// troupe_torch::SyncBatchNorm against LibTorch's batch norm of the ranks'
// inputs taken together (what torch.nn.SyncBatchNorm computes; torch 1.13
// runs it on CUDA only, so the whole batch on one process is the reference,
// as torch's own SyncBatchNorm tests take it): output, input, weight and bias
// gradients, running statistics, with 1 to 4 ranks holding different numbers
// of samples (one none); eval mode; convert_sync_batchnorm; DDP with it.

#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
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
#include "troupe_torch/sync_batch_norm.hpp"

using troupe_torch::SyncBatchNorm;
using troupe_torch::SyncBatchNormImpl;
using troupe_torch::SyncBatchNormOptions;

namespace {

struct bn_case {
  std::vector<std::int64_t> trailing;  // dimensions after (N, C)
  at::ScalarType dtype = at::kFloat;
  c10::optional<double> momentum = 0.1;
  bool affine = true;
  bool track = true;
};

constexpr std::int64_t C = 3;

/// Rank q's samples: 3, 1, 0, 2, ... rows.
std::int64_t rows_of(int q) {
  static const std::int64_t rows[] = {3, 1, 0, 2};
  return rows[q % 4];
}

at::Tensor draw(int q, std::uint64_t salt, const bn_case& c) {
  std::vector<std::int64_t> shape{rows_of(q), C};
  shape.insert(shape.end(), c.trailing.begin(), c.trailing.end());
  return at::randn(shape, ddp_test::gen(salt + q), at::TensorOptions().dtype(c.dtype));
}

void check_close(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  const double tol = a.scalar_type() == at::kDouble ? 1e-10 : 2e-5;
  CHECK_MESSAGE(at::allclose(a, b.to(a.scalar_type()), tol, tol),
                what << ": max difference "
                     << (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>());
}

/// Two training steps and one in eval mode, against batch norm of the whole batch.
void check_whole_batch(troupe::world& w, const bn_case& c) {
  auto& pg = w.default_group();
  const int r = w.rank(), n = w.size();
  auto opts = SyncBatchNormOptions(C)
                  .process_group(&pg)
                  .momentum(c.momentum)
                  .affine(c.affine)
                  .track_running_stats(c.track);
  SyncBatchNorm bn(opts);
  bn->to(c.dtype);
  auto ref_w = at::randn({C}, ddp_test::gen(77), c.dtype),
       ref_b = at::randn({C}, ddp_test::gen(78), c.dtype);
  if (c.affine) {
    at::NoGradGuard no_grad;
    bn->weight.copy_(ref_w);
    bn->bias.copy_(ref_b);
  }
  ref_w.requires_grad_(c.affine);
  ref_b.requires_grad_(c.affine);
  auto rm = at::zeros({C}, c.dtype), rv = at::ones({C}, c.dtype);
  std::int64_t offset = 0;
  for (int q = 0; q < r; ++q) offset += rows_of(q);

  for (int step = 0; step < 2; ++step) {
    CAPTURE(step);
    const std::uint64_t salt = 500 + 100 * step;
    auto x = draw(r, salt, c).requires_grad_();
    auto weights = draw(r, salt + 50, c);
    auto y = bn(x);
    (y * weights).sum().backward();

    // The reference: every rank's samples, one batch norm.
    std::vector<at::Tensor> xs, ws;
    for (int q = 0; q < n; ++q) {
      xs.push_back(draw(q, salt, c));
      ws.push_back(draw(q, salt + 50, c));
    }
    auto all = at::cat(xs).requires_grad_();
    const double factor = c.momentum ? *c.momentum : 1.0 / (step + 1);
    auto ref = at::batch_norm(all, c.affine ? ref_w : at::Tensor(), c.affine ? ref_b : at::Tensor(),
                              c.track ? rm : at::Tensor(), c.track ? rv : at::Tensor(),
                              /*training=*/true, factor, 1e-5, /*cudnn_enabled=*/false);
    (ref * at::cat(ws)).sum().backward();

    const auto mine = ref.narrow(0, offset, rows_of(r));
    check_close(y, mine, "output");
    check_close(x.grad(), all.grad().narrow(0, offset, rows_of(r)), "input's gradient");
    if (c.affine) {
      check_close(ddp_test::sum_over_ranks(pg, bn->weight.grad()), ref_w.grad(),
                  "weight's gradient");
      check_close(ddp_test::sum_over_ranks(pg, bn->bias.grad()), ref_b.grad(), "bias's gradient");
      bn->weight.mutable_grad().zero_();
      bn->bias.mutable_grad().zero_();
      ref_w.mutable_grad().zero_();
      ref_b.mutable_grad().zero_();
    }
    if (c.track) {
      check_close(bn->running_mean, rm, "running_mean");
      check_close(bn->running_var, rv, "running_var");
      CHECK(bn->num_batches_tracked.item<std::int64_t>() == step + 1);
    }
  }

  // Eval mode synchronises nothing: rank 0 alone runs it (the others would
  // otherwise be waited for until the timeout).
  if (r == 0) {
    bn->eval();
    auto x = draw(0, 900, c);
    auto y = bn(x);
    auto ref = at::batch_norm(x, c.affine ? ref_w.detach() : at::Tensor(),
                              c.affine ? ref_b.detach() : at::Tensor(), c.track ? rm : at::Tensor(),
                              c.track ? rv : at::Tensor(), /*training=*/!c.track, 0.1, 1e-5, false);
    check_close(y, ref, "eval output");
  }
  pg.barrier().wait();
}

}  // namespace

TEST_CASE("SyncBatchNorm is batch norm of the ranks' samples taken together") {
  at::set_num_threads(1);
  for (int n : {1, 2, 3, 4})
    troupe::testing::run_ranks(
        n,
        [](troupe::world& w) {
          for (std::vector<std::int64_t> trailing :
               {std::vector<std::int64_t>{}, std::vector<std::int64_t>{5},
                std::vector<std::int64_t>{2, 3}}) {
            bn_case c;
            c.trailing = trailing;
            CAPTURE(trailing.size());
            check_whole_batch(w, c);
          }
          bn_case dbl;
          dbl.trailing = {4};
          dbl.dtype = at::kDouble;
          check_whole_batch(w, dbl);
          bn_case cumulative;  // momentum unset: 1 / num_batches_tracked
          cumulative.trailing = {4};
          cumulative.momentum = c10::nullopt;
          check_whole_batch(w, cumulative);
          bn_case bare;  // no affine, no running statistics
          bare.trailing = {4};
          bare.affine = false;
          bare.track = false;
          check_whole_batch(w, bare);
        },
        ddp_test::quick());
}

TEST_CASE("SyncBatchNorm refuses inputs torch refuses") {
  troupe::testing::run_ranks(
      2,
      [](troupe::world& w) {
        SyncBatchNorm bn(SyncBatchNormOptions(3).process_group(&w.default_group()));
        troupe::test::check_error([&] { bn(at::ones({3})); }, troupe::errc::invalid_argument,
                                  {"SyncBatchNorm", "expected at least 2D input (got 1D input)"});
        troupe::test::check_error(
            [&] {
              bn(at::ones({2, 4}));
            },
            troupe::errc::invalid_argument, {"SyncBatchNorm", "3 channels", "got 4"});
        troupe::test::check_error(
            [&] {
              bn(at::ones({2, 0}));
            },
            troupe::errc::invalid_argument, {"number of input channels should be non-zero"});
      },
      ddp_test::quick());
}

namespace {

/// A module of one's own with batch norms in every kind of container.
struct TowerImpl : torch::nn::Module {
  TowerImpl() {
    register_module("seq", torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6),
                                                 torch::nn::ReLU()));
    auto list = torch::nn::ModuleList();
    list->push_back(torch::nn::BatchNorm2d(
        torch::nn::BatchNorm2dOptions(2).momentum(c10::nullopt).affine(false)));
    list->push_back(torch::nn::Linear(2, 2));
    register_module("list", list);
    auto dict = torch::nn::ModuleDict();
    dict->update(
        {{"bn3", std::make_shared<torch::nn::BatchNorm3dImpl>(
                     torch::nn::BatchNorm3dOptions(5).eps(1e-3).track_running_stats(false))}});
    register_module("dict", dict);
    register_module("own", torch::nn::BatchNorm1d(7));
  }
};

}  // namespace

TEST_CASE("convert_sync_batchnorm replaces every BatchNorm1d/2d/3d, sharing its tensors") {
  troupe::testing::run_ranks(
      1,
      [](troupe::world& w) {
        auto& pg = w.default_group();
        auto tower = std::make_shared<TowerImpl>();
        tower->eval();
        std::map<std::string, std::shared_ptr<torch::nn::Module>> before;
        for (const auto& item : tower->named_modules()) before[item.key()] = item.value();
        auto converted = troupe_torch::convert_sync_batchnorm(tower, pg);
        CHECK(converted == tower);  // changed in place
        std::map<std::string, std::shared_ptr<torch::nn::Module>> after;
        for (const auto& item : tower->named_modules()) after[item.key()] = item.value();
        for (auto name : {"seq.1", "list.0", "dict.bn3", "own"}) {
          CAPTURE(name);
          REQUIRE(after.count(name));
          auto sync = std::dynamic_pointer_cast<SyncBatchNormImpl>(after[name]);
          REQUIRE(sync);
          CHECK(sync->options.process_group() == &pg);
          CHECK(sync->is_training());  // as torch's: new modules train
          auto old = before[name];
          for (const auto& t : old->named_parameters(false))
            CHECK(sync->named_parameters(false)[t.key()].unsafeGetTensorImpl() ==
                  t.value().unsafeGetTensorImpl());
          for (const auto& t : old->named_buffers(false))
            CHECK(sync->named_buffers(false)[t.key()].unsafeGetTensorImpl() ==
                  t.value().unsafeGetTensorImpl());
        }
        auto list_bn = std::dynamic_pointer_cast<SyncBatchNormImpl>(after["list.0"]);
        CHECK(!list_bn->options.momentum());
        CHECK(!list_bn->options.affine());
        CHECK(!list_bn->weight.defined());
        auto dict_bn = std::dynamic_pointer_cast<SyncBatchNormImpl>(after["dict.bn3"]);
        CHECK(dict_bn->options.eps() == 1e-3);
        CHECK(!dict_bn->running_mean.defined());
        CHECK(std::dynamic_pointer_cast<SyncBatchNormImpl>(after["own"])->running_var.defined());
        // The rest keeps its mode and identity.
        CHECK(!after["seq.0"]->is_training());
        CHECK(after["seq.0"] == before["seq.0"]);
        CHECK(after["list.1"] == before["list.1"]);
        // A batch norm itself is replaced; a module without any is returned as it is.
        auto lone = std::make_shared<torch::nn::BatchNorm1dImpl>(4);
        CHECK(std::dynamic_pointer_cast<SyncBatchNormImpl>(
            troupe_torch::convert_sync_batchnorm(lone, pg)));
        auto plain = std::make_shared<torch::nn::LinearImpl>(2, 2);
        CHECK(troupe_torch::convert_sync_batchnorm(plain, pg) == plain);
      },
      ddp_test::quick());
}

TEST_CASE("distributed_data_parallel with convert_sync_batchnorm trains as one process") {
  at::set_num_threads(1);
  for (int n : {2, 3})
    troupe::testing::run_ranks(
        n,
        [](troupe::world& w) {
          auto& pg = w.default_group();
          const int r = w.rank(), n = w.size();
          auto make = [] {
            auto m = torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6),
                                           torch::nn::ReLU(), torch::nn::Linear(6, 2));
            ddp_test::init_params(*m, 21);
            return m;
          };
          auto local = make();
          auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(
              troupe_torch::convert_sync_batchnorm(make().ptr(), pg));
          REQUIRE(model);
          REQUIRE(std::dynamic_pointer_cast<SyncBatchNormImpl>(model->ptr(1)));
          troupe_torch::distributed_data_parallel<torch::nn::SequentialImpl> ddp{model, pg};
          CHECK(ddp.logging_data().has_sync_bn);
          const int per = 4;
          for (int step = 0; step < 3; ++step) {
            auto g = ddp_test::gen(300 + step);
            auto x = at::randn({per * n, 4}, g), y = at::randn({per * n, 2}, g);
            ddp_test::zero_grads(*model);
            torch::nn::functional::mse_loss(ddp.forward(x.narrow(0, r * per, per)),
                                            y.narrow(0, r * per, per))
                .backward();
            ddp_test::sgd(*model, 0.1);
            ddp_test::zero_grads(*local);
            torch::nn::functional::mse_loss(local->forward(x), y).backward();
            ddp_test::sgd(*local, 0.1);
          }
          auto theirs = local->named_parameters();
          for (const auto& item : model->named_parameters())
            CHECK_MESSAGE(at::allclose(item.value(), theirs[item.key()], 1e-5, 1e-6), item.key());
          auto their_buffers = local->named_buffers();
          for (const auto& item : model->named_buffers())
            CHECK_MESSAGE(at::allclose(item.value().to(at::kDouble),
                                       their_buffers[item.key()].to(at::kDouble), 1e-5, 1e-6),
                          item.key());
        },
        ddp_test::quick());
}
