// SyncBatchNorm. Forward:
//   1. local:    count n_r and, per channel, mean m_r and sum of squared
//                deviations M2_r (float64; zeros without samples);
//   2. gather:   [n_r, m_r, M2_r] of every rank (all_gather_into_tensor);
//   3. combine:  N = sum n_r, mean = sum n_r m_r / N,
//                M2 = sum M2_r + n_r (m_r - mean)^2 over ranks with n_r > 0;
//                invstd = 1 / sqrt(M2 / N + eps); running stats updated;
//   4. apply:    y = (x - mean) invstd w + b.
// Backward:
//   1. local:    sum_dy, sum_dy_xmu = sum dy (x - mean) per channel;
//                grad_weight = sum_dy_xmu invstd, grad_bias = sum_dy;
//   2. allreduce [sum_dy, sum_dy_xmu] (zeros from ranks without samples);
//   3. apply:    dx = w invstd (dy - sum_dy / N - (x - mean) invstd^2 sum_dy_xmu / N).

#include "troupe/sync_batch_norm.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "training/tensor_ops.hpp"
#include "troupe/error.hpp"

namespace troupe {

namespace {

[[noreturn]] void refuse(const char* op, const std::string& what) {
  throw error(errc::invalid_argument, std::string(op) + ": " + what);
}

/// The layout of an (N, C, *) input.
struct layout {
  std::int64_t n = 0, c = 0, s = 1;  // batch, channels, values per (sample, channel)
};

layout check_input(const char* op, const tensor& x) {
  if (!x.defined() || !x.is_cpu() || !x.is_contiguous() || x.dim() < 2 ||
      (x.scalar_type() != dtype::float32 && x.scalar_type() != dtype::float64))
    refuse(op, "expected a contiguous host float32 or float64 tensor of shape (N, C, ...), got " +
                   (x.defined() ? x.describe() : std::string("an undefined tensor")));
  layout l{x.shape()[0], x.shape()[1], 1};
  for (std::int64_t d = 2; d < x.dim(); ++d) l.s *= x.shape()[static_cast<std::size_t>(d)];
  return l;
}

void check_channel_tensor(const char* op, const tensor& t, const char* what, std::int64_t c) {
  if (!t.defined()) return;
  if (!t.is_cpu() || !t.is_contiguous() || t.numel() != c ||
      !detail::is_training_float(t.scalar_type()))
    refuse(op, std::string(what) + " must be a host floating tensor of " + std::to_string(c) +
                   " elements (one per channel), got " + t.describe());
}

/// Element i of a float32 or float64 tensor as double.
double get(const tensor& t, std::int64_t i) {
  return t.scalar_type() == dtype::float64 ? t.data_as<double>()[i]
                                           : static_cast<double>(t.data_as<float>()[i]);
}

void put(const tensor& t, std::int64_t i, double v) {
  if (t.scalar_type() == dtype::float64)
    t.data_as<double>()[i] = v;
  else
    t.data_as<float>()[i] = static_cast<float>(v);
}

tensor from_doubles(const std::vector<double>& v, dtype t) {
  auto r = tensor::empty({static_cast<std::int64_t>(v.size())}, t);
  for (std::size_t i = 0; i < v.size(); ++i) put(r, static_cast<std::int64_t>(i), v[i]);
  return r;
}

}  // namespace

batch_norm_stats sync_batch_norm_stats(process_group& pg, const tensor& input,
                                       const sync_batch_norm_options& opts, tensor running_mean,
                                       tensor running_var) {
  const char* op = "sync_batch_norm_stats";
  const auto l = check_input(op, input);
  check_channel_tensor(op, running_mean, "running_mean", l.c);
  check_channel_tensor(op, running_var, "running_var", l.c);
  const auto C = static_cast<std::size_t>(l.c);

  // 1. This rank's count, means and squared deviations.
  const std::int64_t count = l.n * l.s;
  std::vector<double> local(2 * C + 1, 0.0);
  local[0] = static_cast<double>(count);
  if (count > 0)
    for (std::int64_t c = 0; c < l.c; ++c) {
      double sum = 0;
      for (std::int64_t b = 0; b < l.n; ++b)
        for (std::int64_t k = 0; k < l.s; ++k) sum += get(input, (b * l.c + c) * l.s + k);
      const double mean = sum / static_cast<double>(count);
      double m2 = 0;
      for (std::int64_t b = 0; b < l.n; ++b)
        for (std::int64_t k = 0; k < l.s; ++k) {
          const double d = get(input, (b * l.c + c) * l.s + k) - mean;
          m2 += d * d;
        }
      local[1 + static_cast<std::size_t>(c)] = mean;
      local[1 + C + static_cast<std::size_t>(c)] = m2;
    }

  // 2. Every rank's.
  const auto width = static_cast<std::int64_t>(local.size());
  auto all = tensor::empty({width * pg.size()}, dtype::float64);
  pg.allgather_into_tensor(all, tensor::from_vector(local)).wait();
  auto g = all.to_vector<double>();

  // 3. Combined, leaving out ranks without samples.
  double total = 0;
  std::vector<double> mean(C, 0.0), m2(C, 0.0);
  for (int r = 0; r < pg.size(); ++r) {
    const double* row = g.data() + static_cast<std::size_t>(r) * local.size();
    if (row[0] < 1) continue;
    const double both = total + row[0];
    for (std::size_t c = 0; c < C; ++c) {
      const double delta = row[1 + c] - mean[c];
      mean[c] += delta * row[0] / both;
      m2[c] += row[1 + C + c] + delta * delta * total * row[0] / both;
    }
    total = both;
  }
  std::vector<double> invstd(C);
  for (std::size_t c = 0; c < C; ++c)
    invstd[c] = 1.0 / std::sqrt((total > 0 ? m2[c] / total : 0.0) + opts.eps);
  if (total > 0) {
    const double m = opts.momentum;
    for (std::int64_t c = 0; c < l.c; ++c) {
      const auto k = static_cast<std::size_t>(c);
      if (running_mean.defined())
        put(running_mean, c, (1 - m) * get(running_mean, c) + m * mean[k]);
      if (running_var.defined()) {
        const double var = total > 1 ? m2[k] / (total - 1) : m2[k] / total;
        put(running_var, c, (1 - m) * get(running_var, c) + m * var);
      }
    }
  }
  return {from_doubles(mean, input.scalar_type()), from_doubles(invstd, input.scalar_type()),
          static_cast<std::int64_t>(total)};
}

sync_batch_norm_result sync_batch_norm_forward(process_group& pg, const tensor& input,
                                               const tensor& weight, const tensor& bias,
                                               tensor running_mean, tensor running_var,
                                               const sync_batch_norm_options& opts) {
  const char* op = "sync_batch_norm_forward";
  const auto l = check_input(op, input);
  check_channel_tensor(op, weight, "weight", l.c);
  check_channel_tensor(op, bias, "bias", l.c);
  if (l.n * l.s == 1 && pg.size() < 2)
    refuse(op, "Expected more than 1 value per channel when training, got input size 1");
  auto stats = sync_batch_norm_stats(pg, input, opts, running_mean, running_var);
  // 4. y = (x - mean) invstd w + b.
  auto out = tensor::empty(input.shape(), input.scalar_type());
  for (std::int64_t c = 0; c < l.c; ++c) {
    const double scale = get(stats.invstd, c) * (weight.defined() ? get(weight, c) : 1.0);
    const double shift = (bias.defined() ? get(bias, c) : 0.0) - get(stats.mean, c) * scale;
    for (std::int64_t b = 0; b < l.n; ++b)
      for (std::int64_t k = 0; k < l.s; ++k) {
        const auto i = (b * l.c + c) * l.s + k;
        put(out, i, get(input, i) * scale + shift);
      }
  }
  return {out, {input, weight, stats}};
}

sync_batch_norm_grads sync_batch_norm_backward(process_group& pg, const tensor& grad_output,
                                               const sync_batch_norm_saved& saved,
                                               std::array<bool, 3> needs) {
  const char* op = "sync_batch_norm_backward";
  const auto& x = saved.input;
  const auto l = check_input(op, x);
  if (!grad_output.defined() || grad_output.shape() != x.shape() ||
      grad_output.scalar_type() != x.scalar_type() || !grad_output.is_contiguous())
    refuse(op, "grad_output must be contiguous and shaped as the input " + x.describe() + ", got " +
                   (grad_output.defined() ? grad_output.describe() : "an undefined tensor"));
  const auto C = static_cast<std::size_t>(l.c);
  const auto& w = saved.weight;
  const auto& st = saved.stats;

  // 1. This rank's sums (zeros without samples).
  std::vector<double> sums(2 * C, 0.0);  // sum_dy, then sum_dy_xmu
  for (std::int64_t c = 0; c < l.c; ++c) {
    const double mean = get(st.mean, c);
    for (std::int64_t b = 0; b < l.n; ++b)
      for (std::int64_t k = 0; k < l.s; ++k) {
        const auto i = (b * l.c + c) * l.s + k;
        const double dy = get(grad_output, i);
        sums[static_cast<std::size_t>(c)] += dy;
        sums[C + static_cast<std::size_t>(c)] += dy * (get(x, i) - mean);
      }
  }
  sync_batch_norm_grads r;
  if (w.defined() && needs[1]) {
    r.weight = tensor::empty({l.c}, w.scalar_type());
    for (std::int64_t c = 0; c < l.c; ++c)
      put(r.weight, c, sums[C + static_cast<std::size_t>(c)] * get(st.invstd, c));
  }
  if (needs[2]) {
    r.bias = tensor::empty({l.c}, w.defined() ? w.scalar_type() : x.scalar_type());
    for (std::int64_t c = 0; c < l.c; ++c) put(r.bias, c, sums[static_cast<std::size_t>(c)]);
  }
  if (!needs[0]) return r;

  // 2. The whole batch's sums.
  auto all = tensor::from_vector(sums);
  pg.allreduce(all, reduce_op::SUM).wait();
  auto total = all.to_vector<double>();

  // 3. dx = w invstd (dy - sum_dy / N - (x - mean) invstd^2 sum_dy_xmu / N).
  r.input = tensor::empty(x.shape(), x.scalar_type());
  const double n = st.count > 0 ? static_cast<double>(st.count) : 1.0;
  for (std::int64_t c = 0; c < l.c; ++c) {
    const auto k = static_cast<std::size_t>(c);
    const double invstd = get(st.invstd, c), mean = get(st.mean, c);
    const double scale = invstd * (w.defined() ? get(w, c) : 1.0);
    const double mean_dy = total[k] / n, mean_dy_xmu = total[C + k] / n;
    for (std::int64_t b = 0; b < l.n; ++b)
      for (std::int64_t j = 0; j < l.s; ++j) {
        const auto i = (b * l.c + c) * l.s + j;
        const double xmu = get(x, i) - mean;
        put(r.input, i,
            scale * (get(grad_output, i) - mean_dy - xmu * invstd * invstd * mean_dy_xmu));
      }
  }
  return r;
}

}  // namespace troupe
