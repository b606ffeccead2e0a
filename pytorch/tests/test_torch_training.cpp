// LibTorch training on troupe: the differentiable collectives' gradients
// against finite differences across ranks, and distributed_data_parallel
// against training on one process (the seed's DDP parity test), with bucket
// views, unused parameters, no_sync and comm hooks.

#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <functional>
#include <string>
#include <vector>

#include "troupe_torch/doctest.hpp"  // after the torch headers, before check_error.hpp

#include "check_error.hpp"
#include "troupe/default_hooks.hpp"
#include "troupe/powersgd.hpp"
#include "troupe/testing.hpp"
#include "troupe_torch/distributed_data_parallel.hpp"
#include "troupe_torch/functional.hpp"
#include "troupe_torch/tensor.hpp"

using troupe::errc;
using troupe::test::check_error;
namespace F = troupe_torch::functional;

namespace {

troupe::testing::run_options quick() {
  troupe::testing::run_options o;
  o.timeout = std::chrono::seconds(60);
  return o;
}

at::Generator generator(std::uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

at::Tensor randn(std::vector<std::int64_t> shape, std::uint64_t seed,
                 at::ScalarType t = at::kDouble) {
  auto g = generator(seed);
  return at::randn(shape, g, at::TensorOptions().dtype(t));
}

/// The sum over ranks of a local scalar (float64, through troupe).
double sum_over_ranks(troupe::process_group& pg, double v) {
  auto t = troupe::tensor::from_vector<double>({v});
  pg.allreduce(t).wait();
  return t.to_vector<double>()[0];
}

// -- gradients against finite differences ------------------------------------------------------

using forward_fn =
    std::function<std::vector<at::Tensor>(troupe::process_group&, const std::vector<at::Tensor>&)>;
using shape_fn = std::function<std::vector<std::int64_t>(int rank, int leaf)>;

/// L = sum over ranks r of <w_r, f(x)_r>. Autograd's gradient of each rank's
/// inputs must equal the central difference of L in every element of every
/// rank's inputs (the maps are linear, so the difference is exact up to rounding).
void check_gradients(troupe::world& w, const std::string& name, int leaves, const shape_fn& shape,
                     const forward_fn& f) {
  CAPTURE(name);
  auto& pg = w.default_group();
  const int r = w.rank(), n = w.size();
  auto leaf = [&](int l) { return randn(shape(r, l), 100 * r + l + 1); };
  std::vector<at::Tensor> xs;
  for (int l = 0; l < leaves; ++l) xs.push_back(leaf(l).requires_grad_());
  auto local_loss = [&](const std::vector<at::Tensor>& ys) {
    at::Tensor s = at::zeros({}, at::kDouble);
    for (std::size_t i = 0; i < ys.size(); ++i)
      s = s + (randn(ys[i].sizes().vec(), 1000 * r + i) * ys[i]).sum();
    return s;
  };
  local_loss(f(pg, xs)).backward();

  const double eps = 0.5;
  for (int q = 0; q < n; ++q)
    for (int l = 0; l < leaves; ++l) {
      std::int64_t numel = 1;
      for (auto d : shape(q, l)) numel *= d;
      for (std::int64_t k = 0; k < numel; ++k) {
        double values[2];
        for (int side = 0; side < 2; ++side) {
          at::NoGradGuard no_grad;
          std::vector<at::Tensor> moved;
          for (int m = 0; m < leaves; ++m) moved.push_back(leaf(m));
          if (r == q) moved[l].view(-1)[k] += side ? eps : -eps;
          values[side] = sum_over_ranks(pg, local_loss(f(pg, moved)).item<double>());
        }
        if (r == q) {
          const double fd = (values[1] - values[0]) / (2 * eps);
          const double ad = xs[l].grad().view(-1)[k].item<double>();
          CHECK_MESSAGE(ad == doctest::Approx(fd).epsilon(1e-9),
                        "rank " << q << " input " << l << " element " << k);
        }
      }
    }
}

std::vector<at::Tensor> one(at::Tensor t) {
  return {std::move(t)};
}

}  // namespace

TEST_CASE(
    "differentiable collectives: autograd's gradients equal finite differences across ranks") {
  at::set_num_threads(1);
  for (int n : {2, 3})
    troupe::testing::run_ranks(
        n,
        [](troupe::world& w) {
          const int n = w.size();
          auto s3 = [](int, int) { return std::vector<std::int64_t>{3}; };
          check_gradients(w, "broadcast", 1, s3,
                          [n](auto& pg, auto& x) { return one(F::broadcast(pg, x[0], n - 1)); });
          check_gradients(w, "gather", 1, s3,
                          [](auto& pg, auto& x) { return F::gather(pg, x[0], 0); });
          check_gradients(w, "scatter", n, s3,
                          [](auto& pg, auto& x) { return one(F::scatter(pg, x, 1)); });
          for (auto op : {troupe::reduce_op::SUM, troupe::reduce_op::AVG}) {
            check_gradients(
                w, "reduce " + troupe::reduce_op(op).to_string(), 1, s3,
                [n, op](auto& pg, auto& x) { return one(F::reduce(pg, x[0], n - 1, op)); });
            check_gradients(w, "reduce_scatter " + troupe::reduce_op(op).to_string(), n, s3,
                            [op](auto& pg, auto& x) { return one(F::reduce_scatter(pg, x, op)); });
            check_gradients(w, "all_reduce " + troupe::reduce_op(op).to_string(), 1, s3,
                            [op](auto& pg, auto& x) { return one(F::all_reduce(pg, x[0], op)); });
          }
          check_gradients(w, "all_gather", 1, s3,
                          [](auto& pg, auto& x) { return F::all_gather(pg, x[0]); });
          check_gradients(
              w, "all_gather_into_tensor", 1,
              [](int, int) {
                return std::vector<std::int64_t>{2, 2};
              },
              [](auto& pg, auto& x) { return one(F::all_gather_into_tensor(pg, x[0])); });
          // Rank r sends r + q + 1 elements to rank q (and so receives as many).
          check_gradients(
              w, "all_to_all", n, [](int r, int q) { return std::vector<std::int64_t>{r + q + 1}; },
              [](auto& pg, auto& x) { return F::all_to_all(pg, x); });
          // Uneven rows: rank r sends (r + 2q) % 3 + 1 rows of 2 to rank q.
          auto split = [](int r, int q) { return std::int64_t((r + 2 * q) % 3 + 1); };
          check_gradients(
              w, "all_to_all_single", 1,
              [n, split](int r, int) {
                std::int64_t rows = 0;
                for (int q = 0; q < n; ++q) rows += split(r, q);
                return std::vector<std::int64_t>{rows, 2};
              },
              [n, split](auto& pg, auto& x) {
                std::vector<std::int64_t> send, recv;
                for (int q = 0; q < n; ++q) {
                  send.push_back(split(pg.rank(), q));
                  recv.push_back(split(q, pg.rank()));
                }
                return one(F::all_to_all_single(pg, x[0], recv, send));
              });
        },
        quick());
}

TEST_CASE("differentiable collectives refuse reduce ops without a gradient rule") {
  troupe::testing::run_ranks(
      2,
      [](troupe::world& w) {
        auto x = at::ones({2}, at::kDouble).requires_grad_();
        check_error([&] { F::all_reduce(w.default_group(), x, troupe::reduce_op::MAX); },
                    errc::invalid_argument, {"all_reduce", "MAX", "no gradient rule"});
        check_error([&] { F::reduce(w.default_group(), x, 0, troupe::reduce_op::premul_sum(2.0)); },
                    errc::invalid_argument, {"PREMUL_SUM"});
        // The group still works.
        auto y = F::all_reduce(w.default_group(), x);
        CHECK(y.equal(at::full({2}, 2.0, at::kDouble)));
      },
      quick());
}

// -- distributed_data_parallel ---------------------------------------------------------------

namespace {

/// The seed's Net: fc1 2->10, fc2 10->50, fc3 50->4 without bias, ReLU,
/// softmax; a parameter without a gradient; optionally a layer the forward
/// uses only when asked.
struct NetImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr}, extra{nullptr};
  at::Tensor no_grad_param, counter;
  bool use_extra = false;

  explicit NetImpl(bool with_extra = false) {
    fc1 = register_module("fc1", torch::nn::Linear(torch::nn::LinearOptions(2, 10).bias(false)));
    fc2 = register_module("fc2", torch::nn::Linear(torch::nn::LinearOptions(10, 50).bias(false)));
    fc3 = register_module("fc3", torch::nn::Linear(torch::nn::LinearOptions(50, 4).bias(false)));
    if (with_extra) extra = register_module("extra", torch::nn::Linear(4, 4));
    no_grad_param = register_parameter("no_grad_param", at::tensor({2, 2}, at::kLong), false);
    counter = register_buffer("counter", at::zeros({1}));
  }
  at::Tensor forward(at::Tensor x) {
    x = at::relu(fc1(x));
    x = at::relu(fc2(x));
    x = fc3(x);
    if (use_extra && extra) x = extra(x);
    return at::softmax(x, 1);
  }
};

void copy_parameters(torch::nn::Module& from, torch::nn::Module& to) {
  at::NoGradGuard no_grad;
  auto a = from.parameters(), b = to.parameters();
  for (std::size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
}

void check_close(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  CHECK_MESSAGE(at::allclose(a, b, 1.3e-6, 5e-5),
                what << ": max difference " << (a - b).abs().max().item<double>());
}

struct parity_case {
  troupe_torch::ddp_options opts;
  std::function<void(troupe_torch::ddp_engine&, troupe::process_group&)> hook;
  int micro_batches = 1;  // > 1: no_sync on all but the last
  int iterations = 2;
};

/// The seed's DDP parity: each rank trains the DDP model on its slice of a
/// global batch; one local model trains on the whole batch; after every
/// iteration their parameters agree (rtol 1.3e-6, atol 5e-5).
void ddp_parity(troupe::world& w, const parity_case& c) {
  auto& pg = w.default_group();
  const int r = w.rank(), n = w.size();
  auto model = std::make_shared<NetImpl>();
  for (auto& p : model->parameters()) {  // each rank starts elsewhere: DDP broadcasts rank 0's
    at::NoGradGuard no_grad;
    if (p.is_floating_point()) p.add_(0.01 * r);
  }
  troupe_torch::distributed_data_parallel<NetImpl> ddp{model, pg, c.opts};
  if (c.hook) c.hook(ddp, pg);
  auto local = std::make_shared<NetImpl>();
  copy_parameters(*model, *local);
  torch::optim::SGD ddp_opt{model->parameters(), torch::optim::SGDOptions(0.1)};
  torch::optim::SGD local_opt{local->parameters(), torch::optim::SGDOptions(0.1)};
  const int per_rank = 4, global = per_rank * n;
  auto input = randn({global, 2}, 2024, at::kFloat);
  auto target = randn({global, 4}, 2025, at::kFloat);
  for (int it = 0; it < c.iterations; ++it) {
    auto g = generator(1337 + it);
    auto perm = at::randperm(global, g);
    input = input.index_select(0, perm);
    target = target.index_select(0, perm);
    local_opt.zero_grad();
    torch::nn::functional::mse_loss(local->forward(input), target).backward();
    local_opt.step();

    ddp_opt.zero_grad();
    const int step = per_rank / c.micro_batches;
    for (int m = 0; m < c.micro_batches; ++m) {
      auto x = input.slice(0, r * per_rank + m * step, r * per_rank + (m + 1) * step);
      auto y = target.slice(0, r * per_rank + m * step, r * per_rank + (m + 1) * step);
      auto loss = torch::nn::functional::mse_loss(ddp.forward(x), y) / c.micro_batches;
      if (m + 1 < c.micro_batches) {
        auto guard = ddp.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    ddp_opt.step();
    auto a = model->named_parameters(), b = local->named_parameters();
    for (const auto& item : a)
      check_close(item.value(), b[item.key()],
                  "iteration " + std::to_string(it) + " " + item.key());
  }
}

}  // namespace

TEST_CASE("distributed_data_parallel trains as one process on the whole batch (seed's parity)") {
  at::set_num_threads(1);
  for (int n : {2, 3})
    for (bool views : {false, true})
      troupe::testing::run_ranks(
          n,
          [views](troupe::world& w) {
            CAPTURE(views);
            parity_case c;
            c.opts.bucket_cap_bytes = 1048;  // the seed's bucket_cap_mb=0.001: several buckets
            c.opts.gradient_as_bucket_view = views;
            c.iterations = 3;
            ddp_parity(w, c);
          },
          quick());
}

TEST_CASE("distributed_data_parallel: several buckets reduce, .grad is a bucket view when asked") {
  troupe::testing::run_ranks(
      2,
      [](troupe::world& w) {
        auto model = std::make_shared<NetImpl>();
        troupe_torch::ddp_options o;
        o.bucket_cap_bytes = 1048;
        o.gradient_as_bucket_view = true;
        troupe_torch::distributed_data_parallel<NetImpl> ddp{model, w.default_group(), o};
        CHECK(ddp.parameters().size() == 3);  // no_grad_param is broadcast, not reduced
        CHECK(ddp.reducer().bucket_count() >= 2);
        ddp.forward(randn({3, 2}, w.rank(), at::kFloat)).sum().backward();
        for (std::size_t i = 0; i < 3; ++i) {
          auto view = troupe_torch::to_torch(ddp.reducer().gradient(i));
          CHECK(ddp.parameters()[i].grad().data_ptr() == view.data_ptr());
        }
      },
      quick());
}

TEST_CASE(
    "distributed_data_parallel broadcasts parameters at construction and buffers at forward") {
  troupe::testing::run_ranks(
      3,
      [](troupe::world& w) {
        const int r = w.rank();
        auto model = std::make_shared<NetImpl>();
        {
          at::NoGradGuard no_grad;
          for (auto& p : model->parameters()) p.fill_(r + 1);
          model->counter.fill_(10 * r + 1);
        }
        troupe_torch::distributed_data_parallel<NetImpl> ddp{model, w.default_group()};
        for (auto& p : model->parameters()) CHECK(p.eq(1).all().item<bool>());
        CHECK(model->counter.item<float>() == 1.0f);
        model->counter.fill_(100 + r);  // ranks drift apart ...
        ddp.forward(at::ones({1, 2}));
        CHECK(model->counter.item<float>() == 100.0f);  // ... and forward brings rank 0's again
      },
      quick());
}

TEST_CASE("distributed_data_parallel with no_sync accumulates, then synchronises the sum") {
  troupe::testing::run_ranks(
      2,
      [](troupe::world& w) {
        for (bool views : {false, true}) {
          parity_case c;
          c.opts.gradient_as_bucket_view = views;
          c.micro_batches = 2;
          ddp_parity(w, c);
        }
      },
      quick());
}

TEST_CASE("distributed_data_parallel with find_unused_parameters: a layer some ranks skip") {
  troupe::testing::run_ranks(
      3,
      [](troupe::world& w) {
        auto& pg = w.default_group();
        const int r = w.rank(), n = w.size();
        for (bool views : {false, true}) {
          CAPTURE(views);
          auto model = std::make_shared<NetImpl>(true);
          troupe_torch::ddp_options o;
          o.find_unused_parameters = true;
          o.gradient_as_bucket_view = views;
          troupe_torch::distributed_data_parallel<NetImpl> ddp{model, pg, o};
          auto local = std::make_shared<NetImpl>(true);
          copy_parameters(*model, *local);
          for (int step = 0; step < 2; ++step) {
            // Only rank 0 uses the extra layer (and in step 1 nobody does).
            model->use_extra = local->use_extra = (r == 0 && step == 0);
            auto x = randn({4, 2}, 10 * r + step, at::kFloat);
            for (auto& p : model->parameters())
              if (p.grad().defined()) p.mutable_grad().zero_();
            local->zero_grad();
            ddp.forward(x).sum().backward();
            local->forward(x).sum().backward();
            // Expected: the mean over ranks of the local gradients, zeros where unused.
            auto ours = model->named_parameters(), theirs = local->named_parameters();
            for (const auto& item : theirs) {
              if (!item.value().requires_grad()) continue;
              auto g = item.value().grad().defined() ? item.value().grad().clone()
                                                     : at::zeros_like(item.value());
              auto tg = troupe_torch::to_troupe(g);
              pg.allreduce(tg).wait();
              const bool nobody = item.key().rfind("extra", 0) == 0 && step == 1;
              const auto& mine = ours[item.key()].grad();
              if (nobody) {
                // No rank used it in this step: its gradient is left as it was (zero).
                CHECK((!mine.defined() || mine.eq(0).all().item<bool>()));
              } else {
                REQUIRE(mine.defined());
                check_close(mine, g / n, item.key() + " step " + std::to_string(step));
              }
            }
          }
        }
      },
      quick());
}

TEST_CASE("distributed_data_parallel with comm hooks") {
  troupe::testing::run_ranks(
      2,
      [](troupe::world& w) {
        auto& pg = w.default_group();
        parity_case plain;
        plain.hook = [](auto& ddp, auto& g) { ddp.register_comm_hook(troupe::allreduce_hook(g)); };
        ddp_parity(w, plain);
        // Half precision on the wire: the same training within its rounding.
        for (bool bf16 : {false, true}) {
          auto model = std::make_shared<NetImpl>();
          troupe_torch::distributed_data_parallel<NetImpl> ddp{model, pg};
          ddp.register_comm_hook(bf16 ? troupe::bf16_compress_hook(pg)
                                      : troupe::fp16_compress_hook(pg));
          auto local = std::make_shared<NetImpl>();
          copy_parameters(*model, *local);
          auto x = randn({4, 2}, 77 + w.rank(), at::kFloat);
          ddp.forward(x).sum().backward();
          local->forward(x).sum().backward();
          auto ours = model->named_parameters();
          for (const auto& item : local->named_parameters()) {
            if (!item.value().requires_grad()) continue;
            auto g = item.value().grad().clone();
            auto tg = troupe_torch::to_troupe(g);
            pg.allreduce(tg, troupe::reduce_op::AVG).wait();
            CHECK_MESSAGE(at::allclose(ours[item.key()].grad(), g, bf16 ? 2e-2 : 2e-3, 1e-4),
                          item.key());
          }
        }
        // PowerSGD: plain averaging for start_powersgd_iter steps (parity),
        // then compressed; every rank keeps the same parameters.
        parity_case psgd;
        auto state = std::make_shared<troupe::powersgd_state>(
            troupe::powersgd_options{.matrix_approximation_rank = 1, .start_powersgd_iter = 2});
        psgd.hook = [state](auto& ddp, auto& g) {
          ddp.register_comm_hook(troupe::powersgd_hook(g, state));
        };
        psgd.iterations = 2;
        ddp_parity(w, psgd);
      },
      quick());
}
