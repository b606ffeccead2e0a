// move_to_device and to_device with a real device copy (seed 002's
// _recursive_to; label gpu, skipped without a device): a nested structure's
// tensors copied to cuda:0 and back, values and shapes kept, the copies in
// memory of their own; tensors on the target already come back as they are.

#include <doctest/doctest.h>

#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "troupe/apply_to_tensors.hpp"

using namespace troupe;

TEST_CASE("move_to_device copies a structure's tensors to the GPU and back") {
  const auto gpu = device::cuda(0);
  auto weight = tensor::from_vector<float>({1, 2, 3, 4, 5, 6}).view({2, 3});
  auto ids = tensor::from_vector<std::int64_t>({7, -8});
  auto z = tensor::from_vector<std::complex<double>>({{1.0, -1.0}});
  std::tuple<tensor, std::vector<tensor>, std::unordered_map<std::string, tensor>, int> in{
      weight, {ids, tensor{}}, {{"z", z}}, 3};
  auto on_gpu = move_to_device(gpu, in);
  const auto& w = std::get<0>(on_gpu);
  CHECK(w.get_device() == gpu);
  CHECK(w.shape() == shape_t{2, 3});
  CHECK(w.scalar_type() == dtype::float32);
  CHECK(w.data() != weight.data());
  CHECK(std::get<1>(on_gpu)[0].get_device() == gpu);
  CHECK_FALSE(std::get<1>(on_gpu)[1].defined());
  CHECK(std::get<2>(on_gpu).at("z").get_device() == gpu);
  CHECK(std::get<3>(on_gpu) == 3);
  // Already there: the same tensors.
  auto again = move_to_device(gpu, on_gpu);
  CHECK(std::get<0>(again).data() == w.data());
  // And back: the values survived both copies.
  auto back = move_to_device(device::cpu(), on_gpu);
  CHECK(std::get<0>(back).is_cpu());
  CHECK(std::get<0>(back).to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(std::get<0>(back).shape() == shape_t{2, 3});
  CHECK(std::get<1>(back)[0].to_vector<std::int64_t>() == std::vector<std::int64_t>{7, -8});
  CHECK(std::get<2>(back).at("z").to_vector<std::complex<double>>()[0] ==
        std::complex<double>(1.0, -1.0));
  // The GPU copy is its own: changing the source afterwards leaves it.
  weight.data_as<float>()[0] = 100;
  CHECK(to_device(w, device::cpu()).to_vector<float>()[0] == 1.0f);
}

TEST_CASE("a non-contiguous tensor is copied whole to the GPU") {
  std::vector<float> v{0, 1, 2, 3, 4, 5};
  auto strided = tensor::from_blob(v.data(), {3}, {2}, dtype::float32);  // 0, 2, 4
  auto g = to_device(strided, device::cuda(0));
  CHECK(g.is_contiguous());
  CHECK(g.to_vector<float>() == std::vector<float>{0, 2, 4});
}
