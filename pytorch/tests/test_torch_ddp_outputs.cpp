// distributed_data_parallel's outputs: troupe_torch::for_each_tensor and
// apply_to_tensors walk maps, unordered maps, optionals, variants, nested
// containers and a struct of one's own; DDP with find_unused_parameters sees
// every tensor in such an output (a layer reached only through a tensor the
// walk missed would be marked unused, then its gradient's hook would fail
// with "Expected to mark a variable ready only once").

#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <variant>
#include <vector>

#include "troupe_torch/doctest.hpp"  // after the torch headers

#include "ddp_test_support.hpp"
#include "troupe/testing.hpp"
#include "troupe_torch/apply_to_tensors.hpp"
#include "troupe_torch/distributed_data_parallel.hpp"

namespace {

/// A struct of one's own, walked through its inspect overload.
struct detection {
  at::Tensor boxes;
  std::vector<at::Tensor> masks;
  int count = 0;
  std::string label;
};

template <class Inspector>
auto inspect(Inspector& f, detection& d) {
  return f(d.boxes, d.masks, d.count, d.label);
}

}  // namespace

TEST_CASE("for_each_tensor and apply_to_tensors walk nested structures in a fixed order") {
  auto t = [](double v) { return at::full({1}, v, at::kDouble); };
  std::map<std::string, std::pair<at::Tensor, std::optional<at::Tensor>>> m{
      {"a", {t(1), t(2)}}, {"b", {t(3), std::nullopt}}};
  std::unordered_map<int, std::vector<at::Tensor>> um{{7, {t(4), t(5)}}};
  std::tuple<at::Tensor, int, std::string, c10::optional<at::Tensor>> tup{t(6), 1, "x", t(7)};
  std::variant<int, at::Tensor> var{t(8)};
  std::vector<detection> dets{{t(9), {t(10), at::Tensor()}, 2, "cat"}};
  std::array<std::list<at::Tensor>, 1> arr{{{t(11)}}};
  auto all = std::make_tuple(m, um, tup, var, dets, arr);

  std::vector<double> seen;
  int undefined = 0;
  troupe_torch::for_each_tensor(all, [&](const at::Tensor& x) {
    if (x.defined())
      seen.push_back(x.item<double>());
    else
      ++undefined;
  });
  CHECK(seen == std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  CHECK(undefined == 1);

  // Replacing in place, then walking again: the same order, the new tensors.
  troupe_torch::apply_to_tensors(all, [](at::Tensor& x) {
    if (x.defined()) x = x * 10;
  });
  seen.clear();
  troupe_torch::for_each_tensor(all, [&](const at::Tensor& x) {
    if (x.defined()) seen.push_back(x.item<double>());
  });
  CHECK(seen == std::vector<double>{10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110});
  CHECK(std::get<0>(all).at("a").first.item<double>() == 10);  // in place

  // A variant holding no tensor and an empty optional hold none.
  std::variant<int, at::Tensor> none{3};
  std::optional<at::Tensor> empty;
  int count = 0;
  troupe_torch::for_each_tensor(std::make_pair(none, empty), [&](const at::Tensor&) { ++count; });
  CHECK(count == 0);
}

// -- DDP with outputs of every shape -----------------------------------------------------

namespace {

/// Three heads on one input; the forward returns them packed by P.
template <class P>
struct HeadsImpl : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
  P pack;
  HeadsImpl() {
    a = register_module("a", torch::nn::Linear(3, 2));
    b = register_module("b", torch::nn::Linear(3, 2));
    c = register_module("c", torch::nn::Linear(3, 2));
    ddp_test::init_params(*this, 5);
  }
  auto forward(const at::Tensor& x) { return pack(a(x), b(x), c(x)); }
};

/// The loss of an output: the sum of its defined tensors, each weighted.
template <class Out>
at::Tensor loss_of(const Out& out) {
  at::Tensor total = at::zeros({}, at::kFloat);
  double w = 1;
  troupe_torch::for_each_tensor(out, [&](const at::Tensor& t) {
    if (t.defined()) total = total + (t * w).sum();
    w += 0.5;
  });
  return total;
}

/// DDP (find_unused_parameters) on each rank's input against the mean of
/// the ranks' local gradients; `unused` names the heads the output drops.
template <class P>
void check_packed(troupe::world& w, const std::vector<std::string>& unused) {
  auto& pg = w.default_group();
  const int r = w.rank(), n = w.size();
  for (bool views : {false, true}) {
    CAPTURE(views);
    auto model = std::make_shared<HeadsImpl<P>>();
    auto local = std::make_shared<HeadsImpl<P>>();
    troupe_torch::ddp_options o;
    o.find_unused_parameters = true;
    o.gradient_as_bucket_view = views;
    troupe_torch::distributed_data_parallel<HeadsImpl<P>> ddp{model, pg, o};
    for (int step = 0; step < 2; ++step) {
      auto g = ddp_test::gen(40 + 10 * r + step);
      auto x = at::randn({4, 3}, g);
      ddp_test::zero_grads(*model);
      local->zero_grad();
      loss_of(ddp.forward(x)).backward();
      loss_of(local->forward(x)).backward();
      auto ours = model->named_parameters();
      for (const auto& item : local->named_parameters()) {
        const bool dropped =
            std::find(unused.begin(), unused.end(), item.key().substr(0, 1)) != unused.end();
        const auto& mine = ours[item.key()].grad();
        if (dropped) {
          // No rank used it: its gradient is left alone (zero in a bucket view).
          CHECK_MESSAGE((!mine.defined() || mine.eq(0).all().template item<bool>()), item.key());
          continue;
        }
        REQUIRE_MESSAGE(mine.defined(), item.key());
        auto expected = ddp_test::sum_over_ranks(pg, item.value().grad()) / n;
        CHECK_MESSAGE(at::allclose(mine, expected, 1e-5, 1e-6), item.key() << " step " << step);
      }
    }
  }
}

struct as_map {
  std::map<std::string, at::Tensor> operator()(at::Tensor a, at::Tensor b, at::Tensor c) const {
    return {{"a", a}, {"b", b}, {"c", c}};
  }
};
struct as_unordered_map {
  std::unordered_map<std::string, std::vector<at::Tensor>> operator()(at::Tensor a, at::Tensor b,
                                                                      at::Tensor c) const {
    return {{"ab", {a, b}}, {"c", {c}}};
  }
};
struct as_optionals {  // c's head is computed but dropped: unused
  std::pair<std::optional<at::Tensor>, std::optional<at::Tensor>> operator()(at::Tensor a,
                                                                             at::Tensor b,
                                                                             at::Tensor) const {
    return {a, b};
  }
};
struct as_nested {
  std::vector<std::tuple<int, std::map<int, std::optional<at::Tensor>>>> operator()(
      at::Tensor a, at::Tensor b, at::Tensor c) const {
    return {{0, {{1, a}, {2, std::nullopt}}}, {1, {{3, b}}}, {2, {{4, c}}}};
  }
};
struct as_struct {  // b's head is dropped
  std::vector<detection> operator()(at::Tensor a, at::Tensor, at::Tensor c) const {
    return {detection{a, {c}, 1, "a"}};
  }
};
struct as_variant {
  std::variant<at::Tensor, std::vector<at::Tensor>> operator()(at::Tensor a, at::Tensor b,
                                                               at::Tensor c) const {
    return std::vector<at::Tensor>{a, b, c};
  }
};

}  // namespace

TEST_CASE("distributed_data_parallel finds every tensor of a structured output") {
  at::set_num_threads(1);
  for (int n : {1, 2, 3})
    troupe::testing::run_ranks(
        n,
        [](troupe::world& w) {
          check_packed<as_map>(w, {});
          check_packed<as_unordered_map>(w, {});
          check_packed<as_optionals>(w, {"c"});
          check_packed<as_nested>(w, {});
          check_packed<as_struct>(w, {"b"});
          check_packed<as_variant>(w, {});
        },
        ddp_test::quick());
}
