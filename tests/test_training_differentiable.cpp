// Differentiable collectives: every forward/backward pair passes the adjoint
// identity on random data, sum_r <A(x)_r, y_r> == sum_r <x_r, A^T(y)_r>
// (one allreduce of the local dot products), on 1, 2, 3, 4 and 7 ranks (also
// across 2 processes); explicit values; inputs left alone; refused ops.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "check_error.hpp"
#include "troupe/differentiable.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
namespace dx = troupe::differentiable;
using troupe::test::check_error;
using troupe::test::check_exact_error;

namespace {

const int rank_counts[] = {1, 2, 3, 4, 7};

/// Random float64 values in [-1, 1), different per seed.
tensor random_tensor(const shape_t& shape, std::uint64_t seed) {
  auto t = tensor::empty(shape, dtype::float64);
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<double>()[i] = u(gen);
  return t;
}

tensor_list random_list(const std::vector<shape_t>& shapes, std::uint64_t seed) {
  tensor_list r;
  for (std::size_t i = 0; i < shapes.size(); ++i)
    r.push_back(random_tensor(shapes[i], seed * 131 + i));
  return r;
}

double dot(const tensor_list& a, const tensor_list& b) {
  REQUIRE(a.size() == b.size());
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].shape() == b[i].shape());
    for (std::int64_t k = 0; k < a[i].numel(); ++k)
      s += a[i].data_as<double>()[k] * b[i].data_as<double>()[k];
  }
  return s;
}

/// Checks sum over ranks of <ax, y> against sum over ranks of <x, aty>.
void check_adjoint(process_group& pg, const tensor_list& x, const tensor_list& ax,
                   const tensor_list& y, const tensor_list& aty, const char* what) {
  auto sums = tensor::from_vector<double>({dot(ax, y), dot(x, aty)});
  pg.allreduce(sums).wait();
  auto s = sums.to_vector<double>();
  INFO(what << ": <A(x), y> = " << s[0] << ", <x, A^T(y)> = " << s[1]);
  CHECK(std::fabs(s[0] - s[1]) <= 1e-10 * (1.0 + std::fabs(s[0])));
  CHECK(std::fabs(s[0]) > 1e-3);  // not trivially zero
}

std::vector<shape_t> shapes_of(const tensor_list& ts) {
  std::vector<shape_t> r;
  for (auto& t : ts) r.push_back(t.shape());
  return r;
}

std::vector<shape_t> repeat(const shape_t& s, int n) {
  return std::vector<shape_t>(static_cast<std::size_t>(n), s);
}

std::uint64_t seed(const world& w, int salt) {
  return static_cast<std::uint64_t>(w.rank() * 7919 + w.size() * 104729 + salt);
}

}  // namespace

TEST_CASE("broadcast, gather and scatter pass the adjoint identity") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      for (int root : {0, n - 1}) {
        CAPTURE(root);
        // broadcast
        auto x = random_tensor({5, 3}, seed(w, 1));
        const auto x_before = x.to_vector<double>();
        auto ax = dx::broadcast(pg, x, root).result();
        CHECK(x.to_vector<double>() == x_before);  // out of place
        auto y = random_tensor({5, 3}, seed(w, 2));
        check_adjoint(pg, {x}, ax, {y}, dx::broadcast_backward(pg, y, root).result(), "broadcast");
        // gather: y is a list of n on every rank (only dst's counts)
        auto ag = dx::gather(pg, x, root).result();
        REQUIRE(ag.size() == static_cast<std::size_t>(n));
        auto yg = random_list(repeat({5, 3}, n), seed(w, 3));
        check_adjoint(pg, {x}, ag, yg, dx::gather_backward(pg, yg, root).result(), "gather");
        // scatter: every rank passes n tensors (only src's are read)
        auto xs = random_list(repeat({2, 4}, n), seed(w, 4));
        auto as = dx::scatter(pg, xs, root).result();
        auto ys = random_tensor({2, 4}, seed(w, 5));
        auto ats = dx::scatter_backward(pg, ys, root).result();
        REQUIRE(ats.size() == static_cast<std::size_t>(n));
        check_adjoint(pg, xs, as, {ys}, ats, "scatter");
      }
    });
  }
}

TEST_CASE("reduce, reduce_scatter and all_reduce pass the adjoint identity for SUM and AVG") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      for (auto op : {reduce_op::SUM, reduce_op::AVG}) {
        CAPTURE(to_string(op));
        for (int root : {0, n - 1}) {
          auto x = random_tensor({7}, seed(w, 10 + root));
          auto y = random_tensor({7}, seed(w, 20 + root));
          check_adjoint(pg, {x}, dx::reduce(pg, x, root, op).result(), {y},
                        dx::reduce_backward(pg, y, root, op).result(), "reduce");
        }
        auto xs = random_list(repeat({3, 2}, n), seed(w, 30));
        auto y = random_tensor({3, 2}, seed(w, 31));
        auto grads = dx::reduce_scatter_backward(pg, y, op).result();
        REQUIRE(grads.size() == static_cast<std::size_t>(n));
        check_adjoint(pg, xs, dx::reduce_scatter(pg, xs, op).result(), {y}, grads,
                      "reduce_scatter");
        auto x = random_tensor({4, 4}, seed(w, 32));
        const auto before = x.to_vector<double>();
        auto ax = dx::all_reduce(pg, x, op).result();
        CHECK(x.to_vector<double>() == before);
        auto ya = random_tensor({4, 4}, seed(w, 33));
        check_adjoint(pg, {x}, ax, {ya}, dx::all_reduce_backward(pg, ya, op).result(),
                      "all_reduce");
      }
    });
  }
}

TEST_CASE("all_gather and all_gather_into_tensor pass the adjoint identity") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      auto x = random_tensor({3, 2}, seed(w, 40));
      auto ax = dx::all_gather(pg, x).result();
      REQUIRE(ax.size() == static_cast<std::size_t>(n));
      auto ys = random_list(repeat({3, 2}, n), seed(w, 41));
      check_adjoint(pg, {x}, ax, ys, dx::all_gather_backward(pg, ys).result(), "all_gather");

      auto at = dx::all_gather_into_tensor(pg, x).result();
      REQUIRE(at[0].shape() == shape_t{3 * n, 2});
      auto yt = random_tensor({3 * n, 2}, seed(w, 42));
      auto gt = dx::all_gather_into_tensor_backward(pg, yt).result();
      REQUIRE(gt[0].shape() == shape_t{3, 2});
      check_adjoint(pg, {x}, at, {yt}, gt, "all_gather_into_tensor");
    });
  }
}

TEST_CASE("all_to_all and all_to_all_single pass the adjoint identity with uneven shapes") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int r = w.rank();
      // Rank q sends rank p a tensor of 2q + p + 1 rows.
      std::vector<shape_t> send, recv;
      for (int q = 0; q < n; ++q) {
        send.push_back({2 * r + q + 1, 2});
        recv.push_back({2 * q + r + 1, 2});
      }
      auto xs = random_list(send, seed(w, 50));
      auto ax = dx::all_to_all(pg, xs, recv).result();
      CHECK(shapes_of(ax) == recv);
      auto ys = random_list(recv, seed(w, 51));
      auto g = dx::all_to_all_backward(pg, ys, send).result();
      CHECK(shapes_of(g) == send);
      check_adjoint(pg, xs, ax, ys, g, "all_to_all");

      // alltoall_single: rank q sends (q + 2p) % 3 rows to rank p (zeros included).
      std::vector<std::int64_t> x_splits, y_splits;
      std::int64_t rows = 0, out_rows = 0;
      for (int q = 0; q < n; ++q) {
        x_splits.push_back((r + 2 * q) % 3);
        y_splits.push_back((q + 2 * r) % 3);
        rows += x_splits.back();
        out_rows += y_splits.back();
      }
      auto x = random_tensor({rows, 3}, seed(w, 52));
      auto a1 = dx::all_to_all_single(pg, x, y_splits, x_splits).result();
      CHECK(a1[0].shape() == shape_t{out_rows, 3});
      auto y1 = random_tensor({out_rows, 3}, seed(w, 53));
      auto g1 = dx::all_to_all_single_backward(pg, y1, x.shape(), y_splits, x_splits).result();
      CHECK(g1[0].shape() == x.shape());
      if (rows + out_rows > 0) {
        auto sums = tensor::from_vector<double>({dot(a1, {y1}), dot({x}, g1)});
        pg.allreduce(sums).wait();
        auto s = sums.to_vector<double>();
        CHECK(std::fabs(s[0] - s[1]) <= 1e-10 * (1.0 + std::fabs(s[0])));
      }
      // Equal parts (no splits).
      auto xe = random_tensor({2 * n, 2}, seed(w, 54));
      auto ye = random_tensor({2 * n, 2}, seed(w, 55));
      check_adjoint(pg, {xe}, dx::all_to_all_single(pg, xe).result(), {ye},
                    dx::all_to_all_single_backward(pg, ye, xe.shape()).result(),
                    "all_to_all_single");
    });
  }
}

TEST_CASE("explicit values: broadcast backward sums on src, reduce and gather are zero elsewhere") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int src = n / 2;
      const double r1 = w.rank() + 1.0;
      auto g = dx::broadcast_backward(pg, tensor::from_vector<double>({r1, r1, r1}), src).result();
      const double want = w.rank() == src ? n * (n + 1) / 2.0 : 0.0;
      CHECK(g[0].to_vector<double>() == std::vector<double>(3, want));

      auto y = dx::reduce(pg, tensor::from_vector<double>({r1}), src, reduce_op::AVG).result();
      CHECK(y[0].to_vector<double>()[0] == doctest::Approx(w.rank() == src ? (n + 1) / 2.0 : 0.0));

      auto gathered = dx::gather(pg, tensor::from_vector<double>({r1}), src).result();
      for (int q = 0; q < n; ++q)
        CHECK(gathered[static_cast<std::size_t>(q)].to_vector<double>()[0] ==
              (w.rank() == src ? q + 1.0 : 0.0));

      // reduce_scatter AVG backward gives grad / n in every slot.
      auto gs = dx::reduce_scatter_backward(pg, tensor::from_vector<double>({r1}), reduce_op::AVG)
                    .result();
      for (int q = 0; q < n; ++q)
        CHECK(gs[static_cast<std::size_t>(q)].to_vector<double>()[0] ==
              doctest::Approx((q + 1.0) / n));
    });
  }
}

TEST_CASE("ops without a gradient rule and bad shapes are refused with the seed's texts") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    auto x = tensor::from_vector<float>({1, 2, 3});
    for (auto op : {reduce_op::MAX, reduce_op::MIN, reduce_op::PRODUCT}) {
      const auto name = std::string(to_string(op));
      check_error([&] { (void)dx::all_reduce(pg, x, op); }, errc::invalid_argument,
                  {"differentiable.all_reduce", "reduce op " + name, "has no gradient rule"});
      check_error([&] { (void)dx::reduce(pg, x, 0, op); }, errc::invalid_argument,
                  {"differentiable.reduce", name});
      check_error(
          [&] {
            (void)dx::reduce_scatter(pg, {x, x}, op);
          },
          errc::invalid_argument, {"differentiable.reduce_scatter", name});
      check_error([&] { (void)dx::all_reduce_backward(pg, x, op); }, errc::invalid_argument,
                  {"differentiable.all_reduce_backward", name});
    }
    check_exact_error([&] { (void)dx::all_gather_into_tensor_backward(pg, x); },
                      errc::invalid_argument,
                      "differentiable.all_gather_into_tensor_backward: Tensor with dimensions: [3] "
                      "does not have first dimension divisible by world_size: 2");
    check_error([&] { (void)dx::reduce_scatter(pg, {x}); }, errc::invalid_argument,
                {"differentiable.reduce_scatter", "1 tensors", "one per rank (2)"});
    check_error(
        [&] {
          (void)dx::scatter(pg, {x, tensor::from_vector<float>({1})}, w.rank());
        },
        errc::invalid_argument, {"differentiable.scatter", "must all be alike"});
  });
}
