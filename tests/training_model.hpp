#pragma once
// A small multilayer perceptron with hand-written forward and backward for
// the training tests: linear layers (with or without bias) and ReLU between
// them, then either a softmax (the seed's Net: fc1 2->10, fc2 10->50, fc3
// 50->4 without bias) or nothing, and a mean squared error loss. Parameters
// are weight, bias per layer; backward produces gradients last layer first
// and reports each parameter as its gradient is final, as autograd hooks do.

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "troupe/tensor.hpp"

namespace model {

using troupe::tensor;
using troupe::tensor_list;

struct layer_spec {
  int in = 0;
  int out = 0;
};

class mlp {
 public:
  mlp(std::vector<layer_spec> layers, bool bias, bool softmax, std::uint64_t seed)
      : layers_(std::move(layers)), bias_(bias), softmax_(softmax) {
    std::mt19937_64 gen(seed);
    for (auto& l : layers_) {
      std::uniform_real_distribution<float> u(-1.0f / std::sqrt(float(l.in)),
                                              1.0f / std::sqrt(float(l.in)));
      std::vector<float> w(static_cast<std::size_t>(l.in * l.out));
      for (auto& x : w) x = u(gen);
      params_.push_back(tensor::from_vector(w).view({l.out, l.in}));
      if (bias_) {
        std::vector<float> b(static_cast<std::size_t>(l.out));
        for (auto& x : b) x = u(gen);
        params_.push_back(tensor::from_vector(b));
      }
    }
    for (auto& p : params_) grads_.push_back(tensor::zeros(p.shape(), troupe::dtype::float32));
  }

  tensor_list& params() { return params_; }
  /// Where backward writes each gradient (replace them by a reducer's views if wanted).
  tensor_list& grads() { return grads_; }
  std::size_t param_count() const { return params_.size(); }
  int out_dim() const { return layers_.back().out; }

  /// Mean squared error of the model on rows [x] (batch × in) against [t].
  float loss(const std::vector<float>& x, const std::vector<float>& t, int batch) {
    forward(x, batch);
    return mse(t, batch);
  }

  /// Forward and backward on a batch: writes every gradient and calls
  /// ready(i) as parameter i's gradient is final (last layer first, bias
  /// before weight). Returns the loss.
  float step(const std::vector<float>& x, const std::vector<float>& t, int batch,
             const std::function<void(std::size_t)>& ready) {
    forward(x, batch);
    const float l = mse(t, batch);
    // dL/dy of the mean over batch × out.
    const int out = out_dim();
    std::vector<float> dy(acts_.back().size());
    for (std::size_t i = 0; i < dy.size(); ++i)
      dy[i] = 2.0f * (acts_.back()[i] - t[i]) / static_cast<float>(batch * out);
    if (softmax_) {  // through the softmax: dz = y * (dy - sum(dy * y))
      const auto& y = acts_.back();
      for (int b = 0; b < batch; ++b) {
        float s = 0;
        for (int k = 0; k < out; ++k) s += dy[b * out + k] * y[b * out + k];
        for (int k = 0; k < out; ++k) dy[b * out + k] = y[b * out + k] * (dy[b * out + k] - s);
      }
    }
    // dy is now the gradient of the last layer's pre-activation.
    for (int l = static_cast<int>(layers_.size()) - 1; l >= 0; --l) {
      const auto& spec = layers_[static_cast<std::size_t>(l)];
      const auto& in = inputs_[static_cast<std::size_t>(l)];
      const std::size_t wi = static_cast<std::size_t>(l) * (bias_ ? 2 : 1);
      float* gw = grads_[wi].data_as<float>();
      for (int o = 0; o < spec.out; ++o)
        for (int i = 0; i < spec.in; ++i) {
          float s = 0;
          for (int b = 0; b < batch; ++b) s += dy[b * spec.out + o] * in[b * spec.in + i];
          gw[o * spec.in + i] = s;
        }
      if (bias_) {
        float* gb = grads_[wi + 1].data_as<float>();
        for (int o = 0; o < spec.out; ++o) {
          float s = 0;
          for (int b = 0; b < batch; ++b) s += dy[b * spec.out + o];
          gb[o] = s;
        }
        ready(wi + 1);
      }
      ready(wi);
      if (l == 0) break;
      // Into the previous layer: through the weight, then the ReLU.
      const float* w = params_[wi].data_as<float>();
      std::vector<float> dx(static_cast<std::size_t>(batch * spec.in), 0.0f);
      for (int b = 0; b < batch; ++b)
        for (int o = 0; o < spec.out; ++o)
          for (int i = 0; i < spec.in; ++i)
            dx[b * spec.in + i] += dy[b * spec.out + o] * w[o * spec.in + i];
      const auto& pre = pres_[static_cast<std::size_t>(l - 1)];
      for (std::size_t i = 0; i < dx.size(); ++i)
        if (pre[i] <= 0) dx[i] = 0;
      dy = std::move(dx);
    }
    return l;
  }

  /// p -= lr * grad for every parameter, reading gradients from `grads`.
  void sgd(float lr, const tensor_list& grads) {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      float* p = params_[i].data_as<float>();
      const float* g = grads[i].data_as<float>();
      for (std::int64_t k = 0; k < params_[i].numel(); ++k) p[k] -= lr * g[k];
    }
  }

 private:
  void forward(const std::vector<float>& x, int batch) {
    inputs_.clear();
    pres_.clear();
    acts_.clear();
    std::vector<float> a = x;
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const auto& spec = layers_[l];
      const std::size_t wi = l * (bias_ ? 2 : 1);
      const float* w = params_[wi].data_as<float>();
      const float* bs = bias_ ? params_[wi + 1].data_as<float>() : nullptr;
      std::vector<float> z(static_cast<std::size_t>(batch * spec.out));
      for (int b = 0; b < batch; ++b)
        for (int o = 0; o < spec.out; ++o) {
          float s = bs ? bs[o] : 0.0f;
          for (int i = 0; i < spec.in; ++i) s += a[b * spec.in + i] * w[o * spec.in + i];
          z[b * spec.out + o] = s;
        }
      inputs_.push_back(a);
      if (l + 1 < layers_.size()) {
        pres_.push_back(z);
        for (auto& v : z) v = v > 0 ? v : 0;
      }
      a = std::move(z);
    }
    if (softmax_) {
      const int out = out_dim();
      for (int b = 0; b < batch; ++b) {
        float mx = a[b * out];
        for (int k = 1; k < out; ++k) mx = std::max(mx, a[b * out + k]);
        float s = 0;
        for (int k = 0; k < out; ++k) s += (a[b * out + k] = std::exp(a[b * out + k] - mx));
        for (int k = 0; k < out; ++k) a[b * out + k] /= s;
      }
    }
    acts_.push_back(std::move(a));
  }

  float mse(const std::vector<float>& t, int batch) const {
    const auto& y = acts_.back();
    float s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += (y[i] - t[i]) * (y[i] - t[i]);
    return s / static_cast<float>(batch * out_dim());
  }

  std::vector<layer_spec> layers_;
  bool bias_;
  bool softmax_;
  tensor_list params_;
  tensor_list grads_;
  std::vector<std::vector<float>> inputs_;  // each layer's input
  std::vector<std::vector<float>> pres_;    // pre-activations of the hidden layers
  std::vector<std::vector<float>> acts_;    // the output
};

/// Reproducible values in [-1, 1).
inline std::vector<float> random_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(gen);
  return v;
}

/// Rows [first, first + count) of a row-major matrix with `cols` columns.
inline std::vector<float> rows(const std::vector<float>& m, int cols, int first, int count) {
  return {m.begin() + first * cols, m.begin() + (first + count) * cols};
}

}  // namespace model
