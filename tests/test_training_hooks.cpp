// The built-in comm hooks against references: allreduce (the exact mean),
// fp16/bf16 compression (values exact where half precision is, rounded where
// it is not), PowerSGD and batched PowerSGD (c10d's state checks; exact on a
// low-rank mean; the projection identity R^T (M - R) = 0 on full-rank
// gradients; error feedback converging; the compression ratio), and a model
// trained with each hook reaching the loss of plain averaging within a
// stated tolerance. On 1, 2, 3, 4 and 7 ranks.

#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "check_error.hpp"
#include "training_model.hpp"
#include "troupe/default_hooks.hpp"
#include "troupe/powersgd.hpp"
#include "troupe/reducer.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using troupe::test::check_error;
using troupe::test::check_exact_error;

namespace {

const int rank_counts[] = {1, 2, 3, 4, 7};

/// A one-gradient bucket over `buffer` (as the reducer makes them).
grad_bucket single(const tensor& buffer, std::size_t index = 0, std::size_t count = 1) {
  return {index, count, buffer, {0}, {0}, {buffer.shape()}};
}

/// Rank q's gradient matrix (rows × cols) for the PowerSGD tests: rank
/// `rank` of it (0: full), values in [-1, 1).
std::vector<double> rank_matrix(int q, int rows, int cols, int rank, std::uint64_t salt) {
  auto u =
      model::random_values(static_cast<std::size_t>(rows * 3), 500 + salt);  // shared left factors
  auto v = model::random_values(static_cast<std::size_t>(3 * cols), 900 + salt * 31 + q);
  auto full = model::random_values(static_cast<std::size_t>(rows * cols), 1300 + salt * 31 + q);
  std::vector<double> m(static_cast<std::size_t>(rows * cols), 0.0);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      double s = 0;
      if (rank == 0)
        s = full[static_cast<std::size_t>(i * cols + j)];
      else
        for (int k = 0; k < rank; ++k)
          s += double(u[static_cast<std::size_t>(i * 3 + k)]) *
               v[static_cast<std::size_t>(k * cols + j)];
      m[static_cast<std::size_t>(i * cols + j)] = s;
    }
  return m;
}

std::vector<double> mean_matrix(int n, int rows, int cols, int rank, std::uint64_t salt) {
  std::vector<double> s(static_cast<std::size_t>(rows * cols), 0.0);
  for (int q = 0; q < n; ++q) {
    auto m = rank_matrix(q, rows, cols, rank, salt);
    for (std::size_t i = 0; i < s.size(); ++i) s[i] += m[i] / n;
  }
  return s;
}

double norm(const std::vector<double>& a) {
  double s = 0;
  for (auto x : a) s += x * x;
  return std::sqrt(s);
}

double distance(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s);
}

/// Whether every rank holds the same values (sum and sum of squares agree).
void check_same_everywhere(process_group& pg, const std::vector<double>& v) {
  double s = 0, q = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    s += v[i] * static_cast<double>(i + 1);
    q += v[i] * v[i];
  }
  auto lo = tensor::from_vector<double>({s, q}), hi = lo.clone();
  pg.allreduce(lo, reduce_op::MIN).wait();
  pg.allreduce(hi, reduce_op::MAX).wait();
  CHECK(lo.to_vector<double>() == hi.to_vector<double>());
}

}  // namespace

TEST_CASE("allreduce_hook averages the bucket in place") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      auto buffer = tensor::from_vector<float>({float(w.rank()), 1.0f, -2.0f * w.rank()});
      auto hook = allreduce_hook(pg);
      CHECK(hook.ordering == hook_ordering::concurrent);
      auto out = hook.run(single(buffer)).result();
      CHECK(out[0].is_same(buffer));
      CHECK(buffer.to_vector<float>() == std::vector<float>{(n - 1) / 2.0f, 1.0f, -(n - 1.0f)});
    });
  }
}

TEST_CASE("fp16 and bf16 compression: exact where half precision is, rounded where it is not") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      // Multiples of 1/4 over n ranks: every x/n and every partial sum is a
      // short binary fraction, exact in float16 and bfloat16 (n <= 7).
      const float x = 0.25f * static_cast<float>(n * (w.rank() + 1));
      for (auto hook : {fp16_compress_hook(pg), bf16_compress_hook(pg)}) {
        CAPTURE(hook.name);
        auto buffer = tensor::from_vector<float>({x, -x, 0.0f});
        hook.run(single(buffer)).wait();
        const float mean = 0.25f * n * (n + 1) / 2.0f;
        CHECK(buffer.to_vector<float>() == std::vector<float>{mean, -mean, 0.0f});
      }
      // 1 + 2^-14 survives float32 but not float16 (10 mantissa bits): on the
      // wire in float16, the mean comes back as exactly 1. bfloat16 (7 bits)
      // drops 1 + 2^-9 likewise.
      auto a = tensor::from_vector<float>({1.0f + std::ldexp(1.0f, -14)});
      fp16_compress_hook(pg).run(single(a)).wait();
      if (n == 1 || n == 2 || n == 4) CHECK(a.to_vector<float>()[0] == 1.0f);
      auto b = tensor::from_vector<float>({1.0f + std::ldexp(1.0f, -9)});
      bf16_compress_hook(pg).run(single(b)).wait();
      if (n == 1 || n == 2 || n == 4) CHECK(b.to_vector<float>()[0] == 1.0f);
      // Random values: within float16's rounding of the exact mean.
      auto v = model::random_values(64, 40 + static_cast<std::uint64_t>(w.rank()));
      auto buf = tensor::from_vector(v);
      fp16_compress_hook(pg).run(single(buf)).wait();
      std::vector<double> mean(64, 0.0);
      for (int q = 0; q < n; ++q) {
        auto vq = model::random_values(64, 40 + static_cast<std::uint64_t>(q));
        for (int i = 0; i < 64; ++i)
          mean[static_cast<std::size_t>(i)] += vq[static_cast<std::size_t>(i)] / n;
      }
      auto got = buf.to_vector<float>();
      for (int i = 0; i < 64; ++i)
        CHECK(std::fabs(got[static_cast<std::size_t>(i)] - mean[static_cast<std::size_t>(i)]) <=
              2e-3);
    });
  }
}

TEST_CASE("PowerSGD state: c10d's invalid states are refused with its text") {
  for (std::uint64_t start : {0u, 1u})
    for (bool ef : {true, false})
      for (bool warm : {true, false}) {
        if (!ef && !warm) continue;
        check_exact_error(
            [&] {
              powersgd_state s{{.matrix_approximation_rank = 1,
                                .start_powersgd_iter = start,
                                .use_error_feedback = ef,
                                .warm_start = warm}};
            },
            errc::invalid_argument,
            "powersgd_state: Expect `start_powerSGD_iter` > 1 if `use_error_feedback` or "
            "`warm_start` is enabled, because PowerSGD can only be applied after the first two "
            "iterations in DDP.");
      }
  // Without both, starting at once is fine; so is starting at 2 with both.
  powersgd_state a{{.start_powersgd_iter = 0, .use_error_feedback = false, .warm_start = false}};
  powersgd_state b{{.start_powersgd_iter = 2}};
  CHECK(b.iteration() == 0);
  CHECK(b.compression_stats().compression_rate == 0);
  check_error([] { powersgd_state s{{.matrix_approximation_rank = 0}}; }, errc::invalid_argument,
              {"matrix_approximation_rank 0"});
}

TEST_CASE(
    "PowerSGD: plain averaging first, then exact on a low-rank mean, with the compression ratio") {
  for (int n : rank_counts) {
    for (int r : {2, 4}) {  // Gram-Schmidt and Householder QR
      CAPTURE(n);
      CAPTURE(r);
      testing::run_ranks(n, [n, r](world& w) {
        auto& pg = w.default_group();
        const int rows = 32, cols = 24;
        auto state = std::make_shared<powersgd_state>(
            powersgd_options{.matrix_approximation_rank = r, .start_powersgd_iter = 2});
        auto hook = powersgd_hook(pg, state);
        CHECK(hook.ordering == hook_ordering::serial);
        // A bucket: a rank-2 (shared left factor) matrix and a bias.
        auto want = mean_matrix(n, rows, cols, 2, 1);
        for (int step = 0; step < 4; ++step) {
          auto mine = rank_matrix(w.rank(), rows, cols, 2, 1);
          std::vector<double> buf(mine);
          for (int i = 0; i < rows; ++i) buf.push_back(w.rank() + i);
          auto buffer = tensor::from_vector(buf);
          grad_bucket b{0, 1, buffer, {0, 1}, {0, rows * cols}, {{rows, cols}, {rows}}};
          hook.run(b).wait();
          auto got = buffer.to_vector<double>();
          std::vector<double> m(got.begin(), got.begin() + rows * cols);
          INFO("step " << step);
          CHECK(distance(m, want) <= 1e-9 * norm(want));
          for (int i = 0; i < rows; ++i)
            CHECK(got[static_cast<std::size_t>(rows * cols + i)] ==
                  doctest::Approx((n - 1) / 2.0 + i));
          CHECK(state->iteration() == static_cast<std::uint64_t>(step + 1));
        }
        // Two compressed steps of (32 + 24) r elements for the matrix plus 32 for the bias.
        auto stats = state->compression_stats();
        CHECK(stats.numel_before == 2u * (rows * cols + rows));
        CHECK(stats.numel_after == 2u * ((rows + cols) * r + rows));
        CHECK(stats.compression_rate ==
              doctest::Approx(double(rows * cols + rows) / ((rows + cols) * r + rows)));
      });
    }
  }
}

TEST_CASE("PowerSGD on a full-rank mean: a rank-r projection of it, the same on every rank") {
  for (int n : rank_counts) {
    for (bool batched : {false, true}) {
      CAPTURE(n);
      CAPTURE(batched);
      testing::run_ranks(n, [n, batched](world& w) {
        auto& pg = w.default_group();
        const int rows = 12, cols = 12;  // square: the batched form sees the same matrix
        auto state = std::make_shared<powersgd_state>(powersgd_options{
            .start_powersgd_iter = 0, .use_error_feedback = false, .warm_start = false});
        auto hook = batched ? batched_powersgd_hook(pg, state) : powersgd_hook(pg, state);
        auto buffer = tensor::from_vector(rank_matrix(w.rank(), rows, cols, 0, 2));
        hook.run(grad_bucket{0, 1, buffer, {0}, {0}, {{rows, cols}}}).wait();
        auto r = buffer.to_vector<double>();
        auto m = mean_matrix(n, rows, cols, 0, 2);
        check_same_everywhere(pg, r);
        // Rank 1: every 2x2 minor vanishes.
        double worst_minor = 0;
        for (int i = 1; i < rows; ++i)
          for (int j = 1; j < cols; ++j)
            worst_minor = std::max(
                worst_minor,
                std::fabs(r[0] * r[static_cast<std::size_t>(i * cols + j)] -
                          r[static_cast<std::size_t>(j)] * r[static_cast<std::size_t>(i * cols)]));
        INFO("n " << n << " batched " << batched);
        CHECK(worst_minor <= 1e-12);
        // R = P P^T M: the residual M - R is orthogonal to R's columns.
        double worst = 0;
        for (int a = 0; a < cols; ++a)
          for (int b = 0; b < cols; ++b) {
            double s = 0;
            for (int i = 0; i < rows; ++i)
              s += r[static_cast<std::size_t>(i * cols + a)] *
                   (m[static_cast<std::size_t>(i * cols + b)] -
                    r[static_cast<std::size_t>(i * cols + b)]);
            worst = std::max(worst, std::fabs(s));
          }
        CHECK(worst <= 1e-10 * norm(m) * norm(m));
        CHECK(norm(r) > 0.1 * norm(m));
      });
    }
  }
}

TEST_CASE("PowerSGD with error feedback converges on a low-rank gradient and reports its ratio") {
  for (int n : rank_counts) {
    for (bool batched : {false, true}) {
      CAPTURE(n);
      CAPTURE(batched);
      testing::run_ranks(n, [n, batched](world& w) {
        auto& pg = w.default_group();
        const int rows = 20, cols = 16;
        // The same rank-3 gradient every step, compressed at rank 1: one
        // step cannot send it, error feedback sends the rest later, so the
        // running mean of what arrives approaches the true mean like 1/T.
        auto state = std::make_shared<powersgd_state>(
            powersgd_options{.start_powersgd_iter = 2, .random_seed = 7});
        auto hook = batched ? batched_powersgd_hook(pg, state) : powersgd_hook(pg, state);
        auto want = mean_matrix(n, rows, cols, 3, 3);
        std::vector<double> sum(want.size(), 0.0);
        std::vector<double> gaps;
        int compressed = 0;
        for (int step = 0; step < 2 + 256; ++step) {
          auto buffer = tensor::from_vector(rank_matrix(w.rank(), rows, cols, 3, 3));
          grad_bucket b{0, 1, buffer, {0}, {0}, {{rows, cols}}};
          hook.run(b).wait();
          if (step < 2) continue;  // plain averaging
          auto got = buffer.to_vector<double>();
          for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += got[i];
          ++compressed;
          if (compressed == 8 || compressed == 64 || compressed == 256) {
            std::vector<double> avg(sum);
            for (auto& x : avg) x /= compressed;
            gaps.push_back(distance(avg, want) / norm(want));
          }
        }
        INFO("relative gap of the running mean after 8, 64, 256 steps: "
             << gaps[0] << ", " << gaps[1] << ", " << gaps[2]);
        CHECK(gaps[1] < 0.5 * gaps[0]);
        CHECK(gaps[2] < 0.5 * gaps[1]);
        CHECK(gaps[2] < 0.05);
        auto stats = state->compression_stats();
        if (!batched) {
          CHECK(stats.numel_before == 256u * rows * cols);
          CHECK(stats.numel_after == 256u * (rows + cols));
          CHECK(stats.compression_rate == doctest::Approx(double(rows * cols) / (rows + cols)));
        } else {
          // 320 elements padded to an 18 x 18 square: 2 * 18 elements sent.
          CHECK(stats.numel_before == 256u * rows * cols);
          CHECK(stats.numel_after == 256u * 2 * 18);
          CHECK(stats.compression_rate == doctest::Approx(320.0 / 36.0));
        }
      });
    }
  }
}

TEST_CASE("PowerSGD refuses what it cannot compress") {
  testing::run_ranks(1, [](world& w) {
    auto state = std::make_shared<powersgd_state>(powersgd_options{.start_powersgd_iter = 2});
    auto half = tensor::zeros({4}, dtype::float16);
    check_error([&] { (void)powersgd_hook(w.default_group(), state).run(single(half)); },
                errc::invalid_argument, {"powersgd", "float32 and float64", "float16"});
    check_error([&] { (void)powersgd_hook(w.default_group(), nullptr); }, errc::invalid_argument,
                {"powersgd_hook: no state"});
  });
}

TEST_CASE("a model trained with each hook reaches the loss of plain averaging") {
  // Tolerances on the final loss after 60 steps, relative to plain
  // averaging's (measured: fp16 1e-6, bf16 2e-4, PowerSGD rank 2 2.5 %,
  // batched rank 4 7.3 %, the largest at 1 rank): half precision rounds each
  // step's mean gradient; PowerSGD sends an approximation and its error
  // feedback catches up over the following steps; batched PowerSGD
  // approximates the whole bucket as one square matrix, more coarsely.
  struct variant {
    const char* name;
    double tolerance;
  };
  const variant variants[] = {{"allreduce", 1e-6},
                              {"fp16", 1e-3},
                              {"bf16", 1e-2},
                              {"powersgd", 5e-2},
                              {"batched_powersgd", 15e-2}};
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n, &variants](world& w) {
      auto& pg = w.default_group();
      const int per_rank = 8, batch = per_rank * n, steps = 60;
      // Random inputs and targets: the network fits them a little more each step.
      auto x = model::random_values(static_cast<std::size_t>(batch * 6), 6);
      auto targets = model::random_values(static_cast<std::size_t>(batch * 3), 8);
      auto train = [&](const std::string& which) {
        model::mlp net({{6, 24}, {24, 24}, {24, 3}}, true, false, 11);
        reducer red{pg, net.grads(), {.bucket_cap_bytes = 1024}};
        auto state = std::make_shared<powersgd_state>(
            powersgd_options{.matrix_approximation_rank = which == "batched_powersgd" ? 4 : 2,
                             .start_powersgd_iter = 3});
        if (which == "allreduce") red.register_comm_hook(allreduce_hook(pg));
        if (which == "fp16") red.register_comm_hook(fp16_compress_hook(pg));
        if (which == "bf16") red.register_comm_hook(bf16_compress_hook(pg));
        if (which == "powersgd") red.register_comm_hook(powersgd_hook(pg, state));
        if (which == "batched_powersgd") red.register_comm_hook(batched_powersgd_hook(pg, state));
        for (int s = 0; s < steps; ++s) {
          net.step(model::rows(x, 6, w.rank() * per_rank, per_rank),
                   model::rows(targets, 3, w.rank() * per_rank, per_rank), per_rank,
                   [&](std::size_t i) { red.mark_ready(i); });
          red.finish_step();
          net.sgd(0.2f, red.gradients());
        }
        return net.loss(x, targets, batch);
      };
      const float plain = train("plain");
      for (auto& v : variants) {
        const float got = train(v.name);
        INFO(std::string(v.name) << ": final loss " << got << " against " << plain
                                 << " with plain averaging");
        CHECK(std::fabs(got - plain) <= v.tolerance * plain);
      }
    });
  }
}
