// SyncBatchNorm: the seed's two empty-input tests (only rank 0 empty, then
// every rank empty; no NaN in outputs or gradients, with and without the
// input's gradient), statistics, outputs, running statistics and gradients of
// a batch split unevenly over ranks (some with no samples) against one
// process on the whole batch, and the refused shapes. On 1, 2, 3, 4 and 7 ranks.

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "check_error.hpp"
#include "training_model.hpp"
#include "troupe/sync_batch_norm.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using troupe::test::check_error;
using troupe::test::check_exact_error;

namespace {

const int rank_counts[] = {1, 2, 3, 4, 7};

bool finite(const tensor& t) {
  if (!t.defined()) return true;
  for (auto v : t.to_vector<float>())
    if (!std::isfinite(v)) return false;
  return true;
}

tensor constant(const shape_t& shape, float v) {
  auto t = tensor::empty(shape, dtype::float32);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = v;
  return t;
}

/// The seed's _test_not_nan: forward, y.sum() backward, no NaN anywhere.
void check_not_nan(process_group& pg, const tensor& x, bool input_grad) {
  auto weight = constant({2}, 1.0f), bias = constant({2}, 0.0f);
  auto rm = constant({2}, 0.0f), rv = constant({2}, 1.0f);
  auto fwd = sync_batch_norm_forward(pg, x, weight, bias, rm, rv);
  CHECK(fwd.output.shape() == x.shape());
  CHECK(finite(fwd.output));
  CHECK(finite(rm));
  CHECK(finite(rv));
  auto g =
      sync_batch_norm_backward(pg, constant(x.shape(), 1.0f), fwd.saved, {input_grad, true, true});
  CHECK(finite(g.input));
  CHECK(g.input.defined() == input_grad);
  if (input_grad) CHECK(g.input.shape() == x.shape());
  CHECK(finite(g.weight));
  CHECK(finite(g.bias));
}

}  // namespace

TEST_CASE("only empty input (the seed's test_sync_batch_norm_only_empty_input)") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [](world& w) {
      auto& pg = w.default_group();
      // Only rank 0 receives an empty input.
      auto x = constant({w.rank() != 0 ? 1 : 0, 2, 11, 13}, 0.0f);
      check_not_nan(pg, x, true);
      check_not_nan(pg, x, false);
      // Every rank receives an empty input.
      auto e = constant({0, 2, 11, 13}, 0.0f);
      check_not_nan(pg, e, true);
      check_not_nan(pg, e, false);
    });
  }
}

TEST_CASE("empty input before a linear layer (the seed's test_sync_batch_norm_empty_input)") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [](world& w) {
      auto& pg = w.default_group();
      // BatchNorm over (N, 2, 28, 28), then a linear layer 28 -> 2 over the
      // last dimension; loss = sum of the outputs.
      auto lin = model::random_values(2 * 28, 3);
      auto step = [&](std::int64_t batch) {
        auto x =
            tensor::from_vector(model::random_values(static_cast<std::size_t>(batch * 2 * 28 * 28),
                                                     10 + static_cast<std::uint64_t>(w.rank())))
                .view({batch, 2, 28, 28});
        auto fwd = sync_batch_norm_forward(pg, x, constant({2}, 1.0f), constant({2}, 0.0f),
                                           constant({2}, 0.0f), constant({2}, 1.0f));
        // y[b, c, h, o] = sum_k bn[b, c, h, k] lin[o, k]; dL/dbn = sum_o lin[o, k].
        auto h = fwd.output.to_vector<float>();
        std::vector<float> grad_lin(2 * 28, 0.0f);
        for (std::size_t row = 0; row < h.size() / 28; ++row)
          for (int o = 0; o < 2; ++o)
            for (int k = 0; k < 28; ++k)
              grad_lin[static_cast<std::size_t>(o * 28 + k)] +=
                  h[row * 28 + static_cast<std::size_t>(k)];
        auto dbn = constant(x.shape(), 0.0f);
        for (std::int64_t i = 0; i < dbn.numel(); ++i)
          dbn.data_as<float>()[i] =
              lin[static_cast<std::size_t>(i % 28)] + lin[static_cast<std::size_t>(28 + i % 28)];
        auto g = sync_batch_norm_backward(pg, dbn, fwd.saved);
        CHECK(finite(fwd.output));
        CHECK(finite(g.input));
        CHECK(finite(g.weight));
        CHECK(finite(g.bias));
        for (auto v : grad_lin) CHECK(std::isfinite(v));
        if (batch == 0) {
          CHECK(g.weight.to_vector<float>() == std::vector<float>{0, 0});
          CHECK(g.bias.to_vector<float>() == std::vector<float>{0, 0});
          CHECK(grad_lin == std::vector<float>(56, 0.0f));
        }
      };
      step(w.rank() != 0 ? 3 : 0);  // only rank 0 empty
      step(0);                      // every rank empty
    });
  }
}

TEST_CASE(
    "statistics, outputs and gradients of a split batch equal one process on the whole batch") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int C = 3, S = 5;
      // Rank r holds (r + 2) % 3 samples: ranks 1 and 4 hold none.
      auto samples = [](int r) { return (r + 2) % 3; };
      int total = 0, first = 0;
      for (int r = 0; r < n; ++r) {
        if (r < w.rank()) first += samples(r);
        total += samples(r);
      }
      auto all_x = model::random_values(static_cast<std::size_t>(total * C * S), 21);
      auto all_dy = model::random_values(static_cast<std::size_t>(total * C * S), 22);
      for (auto& v : all_x) v = 3.0f * v + 1.0f;
      auto slice = [&](const std::vector<float>& v) {
        std::vector<double> r(v.begin() + first * C * S,
                              v.begin() + (first + samples(w.rank())) * C * S);
        return tensor::from_vector(r).view({samples(w.rank()), C, S});
      };
      const double eps = 1e-5, momentum = 0.25;
      auto weight = tensor::from_vector<double>({0.5, -1.5, 2.0});
      auto bias = tensor::from_vector<double>({0.1, 0.2, -0.3});
      auto rm = tensor::from_vector<double>({1.0, 1.0, 1.0}), rv = rm.clone();
      auto fwd = sync_batch_norm_forward(pg, slice(all_x), weight, bias, rm, rv, {eps, momentum});
      auto g = sync_batch_norm_backward(pg, slice(all_dy), fwd.saved);

      // The reference on the whole batch.
      const double N = total * S;
      auto xs = [&](int b, int c, int k) {
        return double(all_x[static_cast<std::size_t>((b * C + c) * S + k)]);
      };
      auto dys = [&](int b, int c, int k) {
        return double(all_dy[static_cast<std::size_t>((b * C + c) * S + k)]);
      };
      CHECK(fwd.saved.stats.count == total * S);
      for (int c = 0; c < C; ++c) {
        CAPTURE(c);
        double mean = 0, var = 0, sdy = 0, sdyx = 0;
        for (int b = 0; b < total; ++b)
          for (int k = 0; k < S; ++k) mean += xs(b, c, k) / N;
        for (int b = 0; b < total; ++b)
          for (int k = 0; k < S; ++k) {
            var += (xs(b, c, k) - mean) * (xs(b, c, k) - mean) / N;
            sdy += dys(b, c, k);
            sdyx += dys(b, c, k) * (xs(b, c, k) - mean);
          }
        const double invstd = 1 / std::sqrt(var + eps);
        CHECK(fwd.saved.stats.mean.to_vector<double>()[static_cast<std::size_t>(c)] ==
              doctest::Approx(mean).epsilon(1e-12));
        CHECK(fwd.saved.stats.invstd.to_vector<double>()[static_cast<std::size_t>(c)] ==
              doctest::Approx(invstd).epsilon(1e-12));
        CHECK(rm.to_vector<double>()[static_cast<std::size_t>(c)] ==
              doctest::Approx(0.75 + momentum * mean).epsilon(1e-12));
        CHECK(rv.to_vector<double>()[static_cast<std::size_t>(c)] ==
              doctest::Approx(0.75 + momentum * var * N / (N - 1)).epsilon(1e-12));
        const double wc = weight.to_vector<double>()[static_cast<std::size_t>(c)];
        const double bc = bias.to_vector<double>()[static_cast<std::size_t>(c)];
        auto out = fwd.output.to_vector<double>();
        auto gx = g.input.to_vector<double>();
        for (int b = 0; b < samples(w.rank()); ++b)
          for (int k = 0; k < S; ++k) {
            const auto i = static_cast<std::size_t>((b * C + c) * S + k);
            const double x = xs(first + b, c, k), dy = dys(first + b, c, k);
            CHECK(out[i] == doctest::Approx((x - mean) * invstd * wc + bc).epsilon(1e-12));
            const double want =
                wc * invstd * (dy - sdy / N - (x - mean) * invstd * invstd * sdyx / N);
            CHECK(gx[i] == doctest::Approx(want).epsilon(1e-10));
          }
        // Weight and bias gradients: this rank's share; their sum is the whole batch's.
        auto shares =
            tensor::from_vector<double>({g.weight.to_vector<double>()[static_cast<std::size_t>(c)],
                                         g.bias.to_vector<double>()[static_cast<std::size_t>(c)]});
        pg.allreduce(shares).wait();
        CHECK(shares.to_vector<double>()[0] == doctest::Approx(sdyx * invstd).epsilon(1e-10));
        CHECK(shares.to_vector<double>()[1] == doctest::Approx(sdy).epsilon(1e-10));
      }
    });
  }
}

TEST_CASE("one value per channel on one rank and bad shapes are refused") {
  testing::run_ranks(1, [](world& w) {
    auto& pg = w.default_group();
    check_exact_error(
        [&] {
          (void)sync_batch_norm_forward(pg, constant({1, 2}, 1.0f), {}, {}, {}, {});
        },
        errc::invalid_argument,
        "sync_batch_norm_forward: Expected more than 1 value per channel when training, got input "
        "size 1");
    check_error([&] { (void)sync_batch_norm_forward(pg, constant({4}, 1.0f), {}, {}, {}, {}); },
                errc::invalid_argument, {"sync_batch_norm_forward", "(N, C, ...)"});
    check_error(
        [&] {
          (void)sync_batch_norm_forward(pg, constant({4, 2}, 1.0f), constant({3}, 1.0f), {}, {},
                                        {});
        },
        errc::invalid_argument, {"weight", "2 elements"});
    auto fwd = sync_batch_norm_forward(pg, constant({4, 2}, 1.0f), {}, {}, {}, {});
    check_error(
        [&] {
          (void)sync_batch_norm_backward(pg, constant({4, 3}, 1.0f), fwd.saved);
        },
        errc::invalid_argument, {"sync_batch_norm_backward", "grad_output"});
  });
}
