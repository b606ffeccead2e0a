// The reducer: c10d's default bucketing (reverse order, a small first
// bucket), training parity with single-process training (the seed's
// _test_ddp_with_process_group: 2 iterations, bucket cap 1 KB, rtol 1.3e-6,
// atol 5e-5) with and without bucket views, overlap (the first bucket
// completes before the last gradient is marked), launch order, marking
// twice, unused parameters (the error without find_unused_parameters, the
// used-bitmap with it), static_graph, and hooks' results going into the
// buckets. On 1, 2, 3, 4 and 7 ranks; also across 2 processes.

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "check_error.hpp"
#include "training_model.hpp"
#include "troupe/param_sync.hpp"
#include "troupe/reducer.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using troupe::test::check_error;
using troupe::test::check_exact_error;
using indices_t = std::vector<std::vector<std::size_t>>;

namespace {

const int rank_counts[] = {1, 2, 3, 4, 7};
constexpr auto bounded = std::chrono::seconds(30);

/// A gradient of `n` floats holding `v`.
tensor filled(std::int64_t n, float v) {
  return tensor::from_vector(std::vector<float>(static_cast<std::size_t>(n), v));
}

std::vector<float> values(const tensor& t) {
  return t.to_vector<float>();
}

/// The seed's Net.
model::mlp seed_net(std::uint64_t seed) {
  return model::mlp({{2, 10}, {10, 50}, {50, 4}}, /*bias=*/false, /*softmax=*/true, seed);
}

}  // namespace

TEST_CASE("buckets: reverse parameter order, the first reduced capped at first_bucket_bytes") {
  testing::run_ranks(2, [](world& w) {
    tensor_list grads;
    for (int i = 0; i < 6; ++i) grads.push_back(filled(100, 0));  // 400 bytes each
    reducer red{w.default_group(), grads, {.bucket_cap_bytes = 1200, .first_bucket_bytes = 800}};
    CHECK(red.bucket_indices() == indices_t{{5, 4}, {3, 2, 1}, {0}});
    CHECK(red.bucket_size_limits() == std::vector<std::size_t>{800, 1200, 1200});
    CHECK(red.bucket_buffer(1).numel() == 300);
    // c10d's defaults: a small model is one bucket under the 1 MiB first cap.
    reducer small{w.default_group(), {filled(10, 0), filled(10, 0)}};
    CHECK(small.bucket_indices() == indices_t{{1, 0}});
    CHECK(small.bucket_size_limits() == std::vector<std::size_t>{1024 * 1024});
    // Dtypes bucket apart; an explicit assignment is taken as given.
    reducer mixed{w.default_group(),
                  {filled(4, 0), tensor::zeros({4}, dtype::float64), filled(4, 0)},
                  {.bucket_cap_bytes = 1 << 20}};
    CHECK(mixed.bucket_indices() == indices_t{{2, 0}, {1}});
    reducer given{w.default_group(),
                  {filled(4, 0), filled(4, 0), filled(4, 0)},
                  {.bucket_indices = {{0}, {2, 1}}}};
    CHECK(given.bucket_indices() == indices_t{{0}, {2, 1}});
    CHECK(given.bucket_size_limits() == std::vector<std::size_t>{16, 32});
    check_error(
        [&] {
          reducer bad{w.default_group(), {filled(4, 0), filled(4, 0)}, {.bucket_indices = {{0}}}};
        },
        errc::invalid_argument, {"reducer", "parameter 1 is in no bucket"});
  });
}

TEST_CASE("training parity with one process on the whole batch (the seed's DDP test)") {
  for (bool view : {false, true}) {
    for (int n : rank_counts) {
      CAPTURE(view);
      CAPTURE(n);
      testing::run_ranks(n, [n, view](world& w) {
        auto& pg = w.default_group();
        const int local = 2, global = local * n;
        // The reference: one model on the whole batch, initialised as rank 0's.
        auto single = seed_net(1000);
        // The replica: each rank initialised differently, then synced from rank 0 (as DDP does).
        auto ddp = seed_net(1000 + static_cast<std::uint64_t>(w.rank()));
        sync_params_and_buffers(pg, ddp.params());
        // Bucket cap of c10d's bucket_cap_mb=0.001 (1048 bytes): fc3+fc2, then fc1.
        reducer red{pg, ddp.grads(), {.bucket_cap_bytes = 1048, .gradient_as_bucket_view = view}};
        CHECK(red.bucket_indices() == indices_t{{2, 1}, {0}});
        if (view) ddp.grads() = red.gradients();  // the backward writes into the buckets

        auto input = model::random_values(static_cast<std::size_t>(global * 2), 77);
        auto target = model::random_values(static_cast<std::size_t>(global * 4), 78);
        for (int iteration = 0; iteration < 2; ++iteration) {
          single.step(input, target, global, [](std::size_t) {});
          ddp.step(model::rows(input, 2, w.rank() * local, local),
                   model::rows(target, 4, w.rank() * local, local), local,
                   [&](std::size_t i) { red.mark_ready(i); });
          red.finish_step();
          single.sgd(1.0f, single.grads());
          ddp.sgd(1.0f, red.gradients());
          for (std::size_t p = 0; p < single.param_count(); ++p) {
            auto a = values(ddp.params()[p]), b = values(single.params()[p]);
            for (std::size_t k = 0; k < a.size(); ++k) {
              INFO("iteration " << iteration << " param " << p << " element " << k);
              CHECK(std::fabs(a[k] - b[k]) <= 5e-5 + 1.3e-6 * std::fabs(b[k]));
            }
          }
          // Shuffle the batch (the same permutation everywhere) so the slices change.
          std::vector<int> perm(static_cast<std::size_t>(global));
          std::iota(perm.begin(), perm.end(), 0);
          std::mt19937 gen(1337u + static_cast<unsigned>(iteration));
          std::shuffle(perm.begin(), perm.end(), gen);
          auto in2 = input, t2 = target;
          for (int r = 0; r < global; ++r) {
            std::copy_n(input.begin() + perm[r] * 2, 2, in2.begin() + r * 2);
            std::copy_n(target.begin() + perm[r] * 4, 4, t2.begin() + r * 4);
          }
          input = in2;
          target = t2;
        }
        CHECK(red.steps() == 2);
      });
    }
  }
}

TEST_CASE("the first bucket is reduced while later gradients are still unmarked") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      // Four gradients of 64 floats, one bucket each: bucket 0 holds parameter 3.
      tensor_list grads;
      for (int i = 0; i < 4; ++i) grads.push_back(filled(64, 0));
      // The marks below come out of order on purpose: keep the buckets as built.
      reducer red{w.default_group(), grads, {.bucket_cap_bytes = 256, .rebuild_buckets = false}};
      REQUIRE(red.bucket_indices() == indices_t{{3}, {2}, {1}, {0}});
      for (int step = 0; step < 2; ++step) {
        for (int i = 0; i < 4; ++i)
          std::fill_n(grads[static_cast<std::size_t>(i)].data_as<float>(), 64,
                      float(w.rank() * 10 + i + step));
        // Buckets launch in index order: bucket 2 ready first must wait for 0 and 1.
        red.mark_ready(1);
        CHECK_FALSE(red.bucket_work(0).valid());
        CHECK_FALSE(red.bucket_work(2).valid());
        red.mark_ready(3);
        REQUIRE(red.bucket_work(0).valid());
        // Bucket 0's allreduce completes on every rank before parameters 0 and 2 are marked.
        red.bucket_work(0).wait(bounded);
        CHECK(red.bucket_work(0).is_success());
        CHECK_FALSE(red.bucket_work(1).valid());
        CHECK_FALSE(red.bucket_work(2).valid());
        red.mark_ready(2);
        CHECK(red.bucket_work(2).valid());  // 1 was launched with it
        red.mark_ready(0);
        auto report = red.finish_step();
        CHECK(report.unused_parameters.empty());
        for (int i = 0; i < 4; ++i) {
          const float avg = 10.0f * (n - 1) / 2.0f + i + step;
          CHECK(values(grads[static_cast<std::size_t>(i)]) == std::vector<float>(64, avg));
        }
      }
    });
  }
}

TEST_CASE("after the first step the buckets follow rank 0's order of marks") {
  for (bool view : {false, true}) {
    for (int n : rank_counts) {
      CAPTURE(view);
      CAPTURE(n);
      testing::run_ranks(n, [n, view](world& w) {
        // Four gradients of 16 floats, 64 bytes: buckets of two under a 128-byte cap.
        tensor_list grads;
        for (int i = 0; i < 4; ++i) grads.push_back(filled(16, 0));
        reducer red{
            w.default_group(), grads, {.bucket_cap_bytes = 128, .gradient_as_bucket_view = view}};
        REQUIRE(red.bucket_indices() == indices_t{{3, 2}, {1, 0}});
        const auto before = red.gradient(0);
        // The backward produces the gradients first to last on rank 0 (other
        // ranks in yet another order: rank 0's counts).
        const std::vector<std::size_t> order = w.rank() == 0 ? std::vector<std::size_t>{0, 1, 2, 3}
                                                             : std::vector<std::size_t>{2, 0, 3, 1};
        for (int step = 0; step < 3; ++step) {
          for (auto i : order) {
            auto g = red.gradient(i);
            std::fill_n(g.data_as<float>(), 16, float(w.rank() + 10 * i + step));
            red.mark_ready(i);
            if (step > 0 && w.rank() == 0 && i == 1) {
              // Rebuilt: the first bucket (0 and 1) launched before 2 and 3 are marked.
              CHECK(red.bucket_work(0).valid());
              CHECK_FALSE(red.bucket_work(1).valid());
            }
          }
          auto report = red.finish_step();
          CHECK(report.buckets_rebuilt == (step == 0));
          CHECK(red.bucket_indices() == indices_t{{0, 1}, {2, 3}});
          for (std::size_t i = 0; i < 4; ++i)
            CHECK(values(red.gradient(i)) ==
                  std::vector<float>(16, (n - 1) / 2.0f + 10 * i + step));
        }
        // With bucket views the gradients moved into the new buckets.
        CHECK(red.gradient(0).is_same(before) == !view);
        if (!view) CHECK(values(grads[3]) == std::vector<float>(16, (n - 1) / 2.0f + 32));
      });
    }
  }
  // Nothing to rebuild when the marks come in reverse order, or when asked not to.
  testing::run_ranks(2, [](world& w) {
    tensor_list grads{filled(16, 0), filled(16, 0), filled(16, 0)};
    reducer same{w.default_group(), grads, {.bucket_cap_bytes = 128}};
    for (std::size_t i = 3; i-- > 0;) same.mark_ready(i);
    CHECK_FALSE(same.finish_step().buckets_rebuilt);
    reducer kept{w.default_group(), grads, {.bucket_cap_bytes = 128, .rebuild_buckets = false}};
    for (std::size_t i = 0; i < 3; ++i) kept.mark_ready(i);
    CHECK_FALSE(kept.finish_step().buckets_rebuilt);
    CHECK(kept.bucket_indices() == indices_t{{2, 1}, {0}});
  });
}

TEST_CASE("marking twice fails; a step missing marks fails naming them and stays open") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      tensor_list grads{filled(3, 1), filled(3, 2), filled(3, 3), filled(3, 4)};
      reducer red{w.default_group(),
                  grads,
                  {.bucket_cap_bytes = 12, .parameter_names = {"a.w", "a.b", "b.w", "b.b"}}};
      red.mark_ready(3);
      check_exact_error([&] { red.mark_ready(3); }, errc::invalid_argument,
                        "reducer.mark_ready: Expected to mark a variable ready only once. "
                        "Parameter at index 3 with name b.b has been marked as ready twice. This "
                        "means that multiple autograd engine hooks have fired for this particular "
                        "parameter during this iteration.");
      red.mark_ready(2);
      check_error([&] { (void)red.finish_step(); }, errc::invalid_argument,
                  {"reducer.finish_step", "never marked ready", "0 (a.w), 1 (a.b)",
                   "find_unused_parameters"});
      check_error([&] { red.mark_unused(0); }, errc::invalid_argument,
                  {"reducer.mark_unused", "find_unused_parameters or static_graph"});
      check_error([&] { red.mark_ready(9); }, errc::invalid_argument,
                  {"reducer.mark_ready", "index 9 out of range for 4"});
      // The step is still open: mark the rest and finish.
      red.mark_ready(1);
      red.mark_ready(0);
      red.finish_step();
      for (int i = 0; i < 4; ++i)
        CHECK(values(grads[static_cast<std::size_t>(i)]) == std::vector<float>(3, i + 1.0f));
      (void)n;
    });
  }
}

TEST_CASE(
    "find_unused_parameters: locally unused contribute zeros, globally unused keep their grads") {
  for (bool view : {false, true}) {
    for (int n : rank_counts) {
      CAPTURE(view);
      CAPTURE(n);
      testing::run_ranks(n, [n, view](world& w) {
        const int r = w.rank();
        tensor_list grads{filled(2, 0), filled(2, 0), filled(2, 0), filled(2, 0)};
        reducer red{w.default_group(),
                    grads,
                    {.bucket_cap_bytes = 8,
                     .gradient_as_bucket_view = view,
                     .find_unused_parameters = true}};
        auto g = red.gradients();
        for (int step = 0; step < 2; ++step) {
          // 0: used everywhere. 1: used by no rank (its gradient holds 42).
          // 2: unused on rank 0 only (declared). 3: unused on the last rank (not marked).
          std::fill_n(g[0].data_as<float>(), 2, float(r + 1));
          std::fill_n(g[1].data_as<float>(), 2, 42.0f);
          std::fill_n(g[2].data_as<float>(), 2, float(r + 1));
          std::fill_n(g[3].data_as<float>(), 2, float(r + 1));
          if (r != n - 1) red.mark_ready(3);
          if (r == 0)
            red.mark_unused(2);
          else
            red.mark_ready(2);
          red.mark_ready(0);
          auto report = red.finish_step();
          std::vector<std::size_t> unused{1};
          if (r == 0) unused.push_back(2);
          if (r == n - 1) unused.push_back(3);
          std::sort(unused.begin(), unused.end());
          CHECK(report.unused_parameters == unused);
          std::vector<std::size_t> global{1};
          if (n == 1) global = unused;
          CHECK(report.globally_unused_parameters == global);
          const float all = n * (n + 1) / 2.0f;
          CHECK(values(g[0]) == std::vector<float>(2, all / n));
          // Untouched without bucket views; zero in the bucket view.
          CHECK(values(g[1]) == std::vector<float>(2, view ? 0.0f : 42.0f));
          if (n > 1) {
            CHECK(values(g[2]) == std::vector<float>(2, (all - 1) / n));
            CHECK(values(g[3]) == std::vector<float>(2, (all - n) / n));
          }
        }
      });
    }
  }
}

TEST_CASE(
    "static_graph: the first step records marks; later steps mark unused parameters themselves") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      const float r1 = w.rank() + 1.0f;
      tensor_list grads{filled(2, 0), filled(2, 7), filled(2, 0)};
      reducer red{
          w.default_group(),
          grads,
          {.bucket_cap_bytes = 8, .static_graph = true, .parameter_names = {"w", "u", "v"}}};
      for (int step = 0; step < 3; ++step) {
        // Parameter 0 receives two contributions (marked twice, as reentrant
        // checkpointing fires its hook twice); 1 is never used.
        std::fill_n(grads[2].data_as<float>(), 2, r1);
        red.mark_ready(2);
        std::fill_n(grads[0].data_as<float>(), 2, r1);
        red.mark_ready(0);
        for (int k = 0; k < 2; ++k) grads[0].data_as<float>()[k] += r1;
        red.mark_ready(0);
        if (step > 0) {
          check_error([&] { red.mark_ready(0); }, errc::invalid_argument,
                      {"Expected to mark a variable ready only once", "index 0 with name w"});
          check_error([&] { red.mark_ready(1); }, errc::invalid_argument,
                      {"u", "Your training graph has changed in this iteration"});
        }
        auto report = red.finish_step();
        CHECK(report.unused_parameters == std::vector<std::size_t>{1});
        CHECK(report.globally_unused_parameters == std::vector<std::size_t>{1});
        const float mean = (n + 1) / 2.0f;
        CHECK(values(grads[0]) == std::vector<float>(2, 2 * mean));
        CHECK(values(grads[1]) == std::vector<float>(2, 7.0f));
        CHECK(values(grads[2]) == std::vector<float>(2, mean));
      }
    });
  }
}

TEST_CASE("a hook's result goes into the bucket: the seed's simple hook gives 2 everywhere") {
  for (bool view : {false, true}) {
    for (int n : rank_counts) {
      CAPTURE(view);
      CAPTURE(n);
      testing::run_ranks(n, [view](world& w) {
        tensor_list grads{filled(5, 9), filled(3, 9), tensor::zeros({2, 2}, dtype::float32)};
        reducer red{
            w.default_group(), grads, {.bucket_cap_bytes = 16, .gradient_as_bucket_view = view}};
        int calls = 0;
        red.register_comm_hook(
            {[&calls](const grad_bucket& b) {
               ++calls;
               auto ones = filled(b.buffer().numel(), 1.0f);
               return work::completed("ones", "", {ones}).then([](const work& f) {
                 auto t = f.result()[0].clone();
                 for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] += 1.0f;
                 return tensor_list{t};
               });
             },
             hook_ordering::concurrent, "simple"});
        for (std::size_t i = 0; i < grads.size(); ++i) red.mark_ready(i);
        red.finish_step();
        CHECK(calls == static_cast<int>(red.bucket_count()));
        for (auto& g : red.gradients())
          CHECK(values(g) == std::vector<float>(static_cast<std::size_t>(g.numel()), 2.0f));
        if (!view)
          for (auto& g : grads)
            CHECK(values(g) == std::vector<float>(static_cast<std::size_t>(g.numel()), 2.0f));
        check_error([&] { red.register_comm_hook({[](const grad_bucket&) { return work{}; }}); },
                    errc::invalid_argument,
                    {"register_comm_hook can only be called once", "simple"});
      });
    }
  }
}

TEST_CASE("a hook that fails or returns the wrong tensor fails the step naming the bucket") {
  testing::run_ranks(2, [](world& w) {
    tensor_list grads{filled(4, 1), filled(4, 1)};
    reducer bad{w.default_group(), grads, {.bucket_cap_bytes = 16}};
    bad.register_comm_hook(
        {[](const grad_bucket&) { return work::completed("x", "", {filled(3, 0)}); },
         hook_ordering::serial, "short"});
    bad.mark_ready(0);
    bad.mark_ready(1);
    check_error([&] { (void)bad.finish_step(); }, errc::invalid_argument,
                {"reducer.finish_step", "comm hook 'short' of bucket 0", "[3]",
                 "expected the reduced buffer"});
    reducer throwing{w.default_group(), grads, {.bucket_cap_bytes = 16}};
    throwing.register_comm_hook({[](const grad_bucket& b) -> work {
      if (b.index() == 1) throw error(errc::backend, "compression failed");
      return work::completed("x", "", {b.buffer()});
    }});
    throwing.mark_ready(1);
    throwing.mark_ready(0);
    check_error([&] { (void)throwing.finish_step(); }, errc::backend,
                {"reducer.finish_step: bucket 1 (parameters 0) failed", "compression failed"});
  });
}

TEST_CASE("a gradient passed at mark_ready is copied in; parameters must match across ranks") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      tensor_list grads{filled(4, 0)};
      reducer red{w.default_group(), grads};
      red.mark_ready(0, filled(4, float(w.rank())));
      red.finish_step();
      CHECK(values(grads[0]) == std::vector<float>(4, (n - 1) / 2.0f));
      check_error([&] { red.mark_ready(0, filled(5, 0)); }, errc::invalid_argument,
                  {"reducer.mark_ready", "must be like"});
      if (n == 1) return;
      tensor_list odd{filled(w.rank() == 1 ? 5 : 4, 0)};
      check_error(
          [&] {
            reducer r{w.default_group(), odd};
          },
          errc::mismatch, {"verify_param_shapes_across_processes", "rank 1's params[0]"});
    });
  }
}
