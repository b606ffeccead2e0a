// apply_to_tensors over the containers c10d's _apply_to_tensors walks in
// Python — tuples, sets and dicts — as std::tuple, std::set /
// std::unordered_set and std::unordered_map, nested in and around the
// others; and move_to_device on the CPU (seed 002's _recursive_to: a tensor
// already on the target device comes back as it is, structure and
// non-tensor members untouched). The copy to a GPU is test_gpu_move_to_device.

#include <doctest/doctest.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "check_error.hpp"
#include "troupe/apply_to_tensors.hpp"

using namespace troupe;
using troupe::test::check_error;

namespace {

tensor floats(std::vector<float> v) {
  return tensor::from_vector(v);
}

std::vector<float> values(const tensor& t) {
  return t.to_vector<float>();
}

/// fn that doubles a float32 tensor into a new one and counts its calls.
struct doubler {
  int* calls;
  tensor operator()(const tensor& x) const {
    ++*calls;
    auto r = x.clone();
    for (std::int64_t i = 0; i < r.numel(); ++i) r.data_as<float>()[i] *= 2;
    return r;
  }
};

/// Orders tensors by their first value (a set of tensors needs an order).
struct by_first_value {
  bool operator()(const tensor& a, const tensor& b) const {
    return a.data_as<float>()[0] < b.data_as<float>()[0];
  }
};
struct first_value_hash {
  std::size_t operator()(const tensor& t) const {
    return std::hash<float>{}(t.data_as<float>()[0]);
  }
};
struct same_first_value {
  bool operator()(const tensor& a, const tensor& b) const {
    return a.data_as<float>()[0] == b.data_as<float>()[0];
  }
};

struct batch {
  std::tuple<tensor, int, std::string> head;
  std::unordered_map<std::string, tensor> extra;
};

template <class Inspector>
auto inspect(Inspector& f, batch& b) {
  return f(b.head, b.extra);
}

}  // namespace

TEST_CASE("apply_to_tensors walks std::tuple: every element, other members as they are") {
  int calls = 0;
  std::tuple<tensor, int, std::vector<tensor>, std::string, std::tuple<>> t{
      floats({1, 2}), 7, {floats({3}), tensor{}}, "name", {}};
  auto r = apply_to_tensors(doubler{&calls}, t);
  CHECK(calls == 2);  // the undefined tensor is skipped
  CHECK(values(std::get<0>(r)) == std::vector<float>{2, 4});
  CHECK(std::get<1>(r) == 7);
  CHECK(values(std::get<2>(r)[0]) == std::vector<float>{6});
  CHECK_FALSE(std::get<2>(r)[1].defined());
  CHECK(std::get<3>(r) == "name");
  CHECK(values(std::get<0>(t)) == std::vector<float>{1, 2});  // the input is a copy
}

TEST_CASE("apply_to_tensors walks std::unordered_map values, keys left alone") {
  int calls = 0;
  std::unordered_map<std::string, std::pair<tensor, std::optional<tensor>>> m{
      {"a", {floats({1}), floats({2})}}, {"b", {floats({3}), std::nullopt}}};
  auto r = apply_to_tensors(doubler{&calls}, m);
  CHECK(calls == 3);
  CHECK(r.size() == 2);
  CHECK(values(r.at("a").first) == std::vector<float>{2});
  CHECK(values(*r.at("a").second) == std::vector<float>{4});
  CHECK(values(r.at("b").first) == std::vector<float>{6});
  CHECK_FALSE(r.at("b").second.has_value());
  // An unordered_map keyed by numbers, inside a map.
  std::map<int, std::unordered_map<int, tensor>> nested{{1, {{10, floats({5})}}}};
  CHECK(values(apply_to_tensors(doubler{&calls}, nested).at(1).at(10)) == std::vector<float>{10});
}

TEST_CASE("apply_to_tensors rebuilds sets from the mapped elements, with their order or hash") {
  int calls = 0;
  std::set<tensor, by_first_value> s{floats({3}), floats({1}), floats({2})};
  auto r = apply_to_tensors(doubler{&calls}, s);
  CHECK(calls == 3);
  std::vector<float> got;
  for (auto& t : r) got.push_back(values(t)[0]);
  CHECK(got == std::vector<float>{2, 4, 6});  // ordered by the set's own comparator
  // Elements that map to equal ones become one, as a Python set rebuilt does.
  auto to_zero = [](const tensor& t) {
    auto z = t.clone();
    z.zero_();
    return z;
  };
  CHECK(apply_to_tensors(to_zero, s).size() == 1);
  std::unordered_set<tensor, first_value_hash, same_first_value> u{floats({1}), floats({5})};
  auto ru = apply_to_tensors(doubler{&calls}, u);
  CHECK(calls == 5);
  CHECK(ru.size() == 2);
  CHECK(ru.count(floats({2})) == 1);
  CHECK(ru.count(floats({10})) == 1);
  // Sets of values that hold no tensor are left as they are.
  std::tuple<std::set<int>, std::unordered_set<std::string>> plain{{3, 1}, {"x"}};
  auto rp = apply_to_tensors(doubler{&calls}, plain);
  CHECK(calls == 5);
  CHECK(std::get<0>(rp) == std::set<int>{1, 3});
}

TEST_CASE("apply_to_tensors walks the new containers inside inspect structs and back") {
  int calls = 0;
  std::vector<batch> batches{{{floats({1}), 4, "x"}, {{"mask", floats({0.5f})}}}};
  auto r = apply_to_tensors(doubler{&calls}, batches);
  CHECK(calls == 2);
  CHECK(values(std::get<0>(r[0].head)) == std::vector<float>{2});
  CHECK(std::get<1>(r[0].head) == 4);
  CHECK(values(r[0].extra.at("mask")) == std::vector<float>{1});
}

TEST_CASE("cast_floating_tensors casts through tuples, sets and unordered maps") {
  std::tuple<tensor, std::unordered_map<int, tensor>> in{
      floats({1.5f}), {{1, tensor::from_vector<std::int64_t>({3})}, {2, floats({-2})}}};
  auto out = cast_floating_tensors(dtype::bfloat16, in);
  CHECK(std::get<0>(out).scalar_type() == dtype::bfloat16);
  CHECK(std::get<1>(out).at(1).scalar_type() == dtype::int64);  // not floating: as it is
  CHECK(std::get<1>(out).at(1).is_same(std::get<1>(in).at(1)));
  CHECK(static_cast<float>(std::get<1>(out).at(2).to_vector<bfloat16_t>()[0]) == -2.0f);
}

TEST_CASE("move_to_device to the CPU: tensors there already come back as they are") {
  auto empty = tensor::zeros({0}, dtype::float32);
  auto base = floats({1, 2, 3, 4});
  std::tuple<tensor, std::vector<tensor>, std::unordered_map<std::string, tensor>, int> in{
      base, {base.flat_slice(1, 2), empty}, {{"k", base.view({2, 2})}}, 9};
  auto out = move_to_device(device::cpu(), in);
  // Same memory, same shapes: no copy (as _recursive_to returns the object itself).
  CHECK(std::get<0>(out).is_same(base));
  CHECK(std::get<0>(out).data() == base.data());
  CHECK(std::get<1>(out)[0].data() == base.flat_slice(1, 2).data());
  CHECK(std::get<1>(out)[0].numel() == 2);
  CHECK(std::get<1>(out)[1].numel() == 0);
  CHECK(std::get<2>(out).at("k").shape() == shape_t{2, 2});
  CHECK(std::get<2>(out).at("k").data() == base.data());
  CHECK(std::get<3>(out) == 9);
  CHECK(to_device(base, device::cpu()).is_same(base));
  check_error([] { (void)to_device(tensor{}, device::cpu()); }, errc::invalid_argument,
              {"to_device: undefined tensor"});
  // Without a GPU, a copy to cuda fails naming the call; with one it is
  // test_gpu_move_to_device's.
  if (!cuda_available()) CHECK_THROWS((void)move_to_device(device::cuda(0), in));
}
