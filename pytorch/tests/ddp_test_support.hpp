#pragma once
// What the test_torch_ddp suites share: seeded draws (LibTorch's generator
// gives what torch.Generator gives in Python for the same seed), parameter
// initialisation as torch_ddp_reference.py does it, and the reference that
// script wrote from torch 1.13's own DDP on gloo
// (data/torch_ddp_reference.txt).

#include <torch/nn/module.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/process_group.hpp"
#include "troupe/testing.hpp"
#include "troupe_torch/tensor.hpp"

namespace ddp_test {

inline at::Generator gen(std::uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

/// Every parameter, in registration order, from randn * scale (the script's init_params).
inline void init_params(torch::nn::Module& m, std::uint64_t seed, double scale = 0.1) {
  auto g = gen(seed);
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.copy_(at::randn(p.sizes(), g) * scale);
}

/// p -= lr * p.grad for every parameter with a gradient (the script's sgd).
inline void sgd(torch::nn::Module& m, double lr) {
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters())
    if (p.grad().defined()) p.sub_(p.grad() * lr);
}

inline void zero_grads(torch::nn::Module& m) {
  for (auto& p : m.parameters())
    if (p.grad().defined()) p.mutable_grad().zero_();
}

inline troupe::testing::run_options quick() {
  troupe::testing::run_options o;
  o.timeout = std::chrono::seconds(60);
  return o;
}

/// One entry of the reference file.
struct entry {
  char kind = 's';  // s string, i integer, t tensor, e error
  std::string text;
  at::Tensor tensor;
};

/// The reference written by torch_ddp_reference.py, by key.
inline const std::map<std::string, entry>& reference() {
  static const std::map<std::string, entry> table = [] {
    std::map<std::string, entry> r;
    std::ifstream in{TROUPE_TORCH_DDP_REFERENCE};
    if (!in) throw std::runtime_error(std::string("cannot read ") + TROUPE_TORCH_DDP_REFERENCE);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      entry e;
      e.kind = line[0];
      const auto key_end = line.find(' ', 2);
      const auto key = line.substr(2, key_end - 2);
      const auto rest = key_end == std::string::npos ? std::string() : line.substr(key_end + 1);
      if (e.kind == 't') {
        std::istringstream s{rest};
        int nd = 0;
        s >> nd;
        std::vector<std::int64_t> shape(static_cast<std::size_t>(nd));
        for (auto& d : shape) s >> d;
        std::vector<float> values;
        float v;
        while (s >> v) values.push_back(v);
        e.tensor = at::tensor(values).reshape(shape);
      } else {
        e.text = rest;
      }
      r[key] = std::move(e);
    }
    return r;
  }();
  return table;
}

/// The entries whose keys start with `prefix`, the prefix taken off.
inline std::map<std::string, entry> reference_under(const std::string& prefix) {
  std::map<std::string, entry> r;
  for (const auto& [k, e] : reference())
    if (k.rfind(prefix, 0) == 0) r[k.substr(prefix.size())] = e;
  return r;
}

/// The sum over the group's ranks of a tensor (float64 through troupe).
inline at::Tensor sum_over_ranks(troupe::process_group& pg, const at::Tensor& t) {
  auto d = t.detach().to(at::kDouble).contiguous().clone();
  auto td = troupe_torch::to_troupe(d);
  pg.allreduce(td).wait();
  return d.to(t.scalar_type());
}

}  // namespace ddp_test
