// data_parallel_mlp — data-parallel training with troupe::reducer and a comm
// hook: each rank holds a replica of a small MLP (hand-written forward and
// backward), trains on its slice of every minibatch, and marks each layer's
// gradients ready as its backward produces them, so the reducer averages a
// bucket (here in float16, fp16_compress_hook) while the backward of the
// earlier layers goes on. Every rank ends with the loss one process reaches
// on the whole data, which rank 0 checks.
//
//   data_parallel_mlp [--ranks 4] [--epochs 20] [--hook fp16|bf16|allreduce|powersgd]
//   troupe-run -n 4 data_parallel_mlp      (one rank per process)

#include <troupe/default_hooks.hpp>
#include <troupe/launch.hpp>
#include <troupe/param_sync.hpp>
#include <troupe/powersgd.hpp>
#include <troupe/reducer.hpp>
#include <troupe/testing.hpp>
#include <troupe/troupe.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using troupe::tensor;
using vec = std::vector<float>;

/// Linear layers with bias, ReLU between them; parameters weight, bias per layer.
struct mlp {
  std::vector<int> sizes;  // 16, 64, 64, 4
  troupe::tensor_list params, grads;
  std::vector<vec> acts;  // the input of each layer, then the output

  mlp(std::vector<int> s, unsigned seed) : sizes(std::move(s)) {
    std::mt19937 gen(seed);
    for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
      std::normal_distribution<float> d(0.0f, 1.0f / std::sqrt(float(sizes[l])));
      // A weight (out x in) and a bias (out).
      for (troupe::shape_t shape : {troupe::shape_t{sizes[l + 1], sizes[l]}, {sizes[l + 1]}}) {
        auto p = tensor::empty(shape, troupe::dtype::float32);
        for (std::int64_t k = 0; k < p.numel(); ++k) p.data_as<float>()[k] = d(gen);
        params.push_back(p);
        grads.push_back(tensor::zeros(shape, troupe::dtype::float32));
      }
    }
  }
  float* w(std::size_t l) { return params[2 * l].data_as<float>(); }
  float* b(std::size_t l) { return params[2 * l + 1].data_as<float>(); }

  vec forward(const vec& x, int batch) {
    acts = {x};
    for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
      const int in = sizes[l], out = sizes[l + 1];
      vec y(static_cast<std::size_t>(batch * out));
      for (int n = 0; n < batch; ++n)
        for (int o = 0; o < out; ++o) {
          float s = b(l)[o];
          for (int i = 0; i < in; ++i) s += w(l)[o * in + i] * acts[l][n * in + i];
          y[n * out + o] = (l + 2 < sizes.size() && s < 0) ? 0 : s;  // ReLU but last
        }
      acts.push_back(std::move(y));
    }
    return acts.back();
  }

  /// Mean squared error on a batch; backward writes the gradients and calls
  /// ready(i) as parameter i's gradient is final (last layer first).
  float train_step(const vec& x, const vec& t, int batch,
                   const std::function<void(std::size_t)>& ready) {
    auto y = forward(x, batch);
    vec dy(y.size());
    float loss = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      loss += (y[i] - t[i]) * (y[i] - t[i]) / y.size();
      dy[i] = 2 * (y[i] - t[i]) / y.size();
    }
    for (std::size_t l = sizes.size() - 1; l-- > 0;) {
      const int in = sizes[l], out = sizes[l + 1];
      float* gw = grads[2 * l].data_as<float>();
      float* gb = grads[2 * l + 1].data_as<float>();
      vec dx(static_cast<std::size_t>(batch * in), 0.0f);
      for (int o = 0; o < out; ++o) {
        gb[o] = 0;
        for (int i = 0; i < in; ++i) gw[o * in + i] = 0;
      }
      for (int n = 0; n < batch; ++n)
        for (int o = 0; o < out; ++o) {
          const float g = dy[n * out + o];
          gb[o] += g;
          for (int i = 0; i < in; ++i) {
            gw[o * in + i] += g * acts[l][n * in + i];
            dx[n * in + i] += g * w(l)[o * in + i];
          }
        }
      ready(2 * l + 1);  // this layer's gradients are final: hand them over
      ready(2 * l);
      for (std::size_t i = 0; i < dx.size(); ++i)
        if (acts[l][i] <= 0) dx[i] = 0;  // through the previous layer's ReLU
      dy = std::move(dx);
    }
    return loss;
  }

  void sgd(float lr, const troupe::tensor_list& g) {
    for (std::size_t p = 0; p < params.size(); ++p)
      for (std::int64_t k = 0; k < params[p].numel(); ++k)
        params[p].data_as<float>()[k] -= lr * g[p].data_as<float>()[k];
  }

  float loss(const vec& x, const vec& t, int batch) {
    auto y = forward(x, batch);
    float s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += (y[i] - t[i]) * (y[i] - t[i]) / y.size();
    return s;
  }
};

struct options {
  int ranks = 4;
  int epochs = 20;
  std::string hook = "fp16";
};

constexpr int samples = 480, features = 16, outputs = 4, batches = 5;
constexpr float learning_rate = 0.1f;

/// Synthetic data: inputs in [-1, 1), targets from a fixed random "teacher" MLP.
void make_data(vec& x, vec& t) {
  std::mt19937 gen(2024);
  std::uniform_real_distribution<float> u(-1, 1);
  x.resize(samples * features);
  for (auto& v : x) v = u(gen);
  mlp teacher({features, 32, outputs}, 99);
  t = teacher.forward(x, samples);
}

vec rows(const vec& m, int width, int first, int count) {
  return {m.begin() + first * width, m.begin() + (first + count) * width};
}

/// One process on the whole data: the reference the ranks must reach.
float train_alone(const options& o, const vec& x, const vec& t) {
  mlp net({features, 64, 64, outputs}, 1);
  const int batch = samples / batches;
  for (int e = 0; e < o.epochs; ++e)
    for (int k = 0; k < batches; ++k) {
      net.train_step(rows(x, features, k * batch, batch), rows(t, outputs, k * batch, batch), batch,
                     [](std::size_t) {});
      net.sgd(learning_rate, net.grads);
    }
  return net.loss(x, t, samples);
}

troupe::comm_hook make_hook(const std::string& name, troupe::process_group& pg) {
  if (name == "fp16") return troupe::fp16_compress_hook(pg);
  if (name == "bf16") return troupe::bf16_compress_hook(pg);
  if (name == "allreduce") return troupe::allreduce_hook(pg);
  if (name == "powersgd")
    return troupe::powersgd_hook(pg,
                                 std::make_shared<troupe::powersgd_state>(troupe::powersgd_options{
                                     .matrix_approximation_rank = 4, .start_powersgd_iter = 10}));
  throw std::invalid_argument("unknown hook '" + name + "' (fp16, bf16, allreduce, powersgd)");
}

/// One rank's training; returns its final loss on the whole data.
void train_rank(troupe::world& w, const options& o, const vec& x, const vec& t, float reference) {
  auto& pg = w.default_group();
  const int n = w.size(), batch = samples / batches, mine = batch / n;
  // Replicas start differently; rank 0's weights are broadcast to all (as DDP does).
  mlp net({features, 64, 64, outputs}, w.rank() == 0 ? 1u : 1000u + w.rank());
  troupe::sync_params_and_buffers(pg, net.params);
  // 16 KiB buckets: the last layers' gradients go while the first layers' are computed.
  troupe::reducer red{pg, net.grads, {.bucket_cap_bytes = 16 * 1024}};
  red.register_comm_hook(make_hook(o.hook, pg));
  if (w.rank() == 0)
    std::printf("%d ranks, %zu buckets, hook %s, %d samples per rank per step\n", n,
                red.bucket_count(), o.hook.c_str(), mine);
  float loss = 0;
  for (int e = 0; e < o.epochs; ++e) {
    for (int k = 0; k < batches; ++k) {
      const int first = k * batch + w.rank() * mine;
      net.train_step(rows(x, features, first, mine), rows(t, outputs, first, mine), mine,
                     [&](std::size_t i) { red.mark_ready(i); });
      red.finish_step();  // the gradients now hold the averages over the ranks
      net.sgd(learning_rate, red.gradients());
    }
    // The loss on the whole data: each rank measures its share, an allreduce averages.
    const int share = samples / n;
    auto l =
        tensor::from_vector<float>({net.loss(rows(x, features, w.rank() * share, share),
                                             rows(t, outputs, w.rank() * share, share), share)});
    pg.allreduce(l, troupe::reduce_op::AVG).wait();
    loss = l.to_vector<float>()[0];
    if (w.rank() == 0) std::printf("epoch %2d  loss %.6f\n", e + 1, loss);
  }
  if (w.rank() != 0) return;
  const double gap = std::fabs(loss - reference) / reference;
  std::printf("final loss %.6f; one process on the whole data: %.6f (relative gap %.1e)\n", loss,
              reference, gap);
  const double allowed = o.hook == "powersgd" ? 5e-2 : o.hook == "bf16" ? 1e-2 : 1e-3;
  if (!(gap <= allowed))
    throw std::runtime_error("the ranks did not reach the single-process loss (allowed gap " +
                             std::to_string(allowed) + ")");
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument("missing value after " + a);
    if (a == "--ranks")
      o.ranks = std::stoi(argv[++i]);
    else if (a == "--epochs")
      o.epochs = std::stoi(argv[++i]);
    else if (a == "--hook")
      o.hook = argv[++i];
    else
      throw std::invalid_argument("unknown argument " + a);
  }
  if (o.ranks < 1 || (samples / batches) % o.ranks != 0 || samples % o.ranks != 0)
    throw std::invalid_argument("--ranks must divide " + std::to_string(samples / batches));
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto o = parse(argc, argv);
    vec x, t;
    make_data(x, t);
    const float reference = train_alone(o, x, t);
    if (troupe::launched_by_launcher()) {
      // One rank per process, as troupe-run (or mpirun, srun) started them.
      auto w = troupe::init_world({.timeout = std::chrono::seconds(120)});
      o.ranks = w->size();
      if ((samples / batches) % o.ranks != 0)
        throw std::invalid_argument("the job's size must divide 96");
      train_rank(*w, o, x, t, reference);
      w->default_group().barrier().wait();
    } else {
      // Ranks as threads of this process, each with its own world.
      troupe::testing::run_ranks(o.ranks,
                                 [&](troupe::world& w) { train_rank(w, o, x, t, reference); },
                                 {.timeout = std::chrono::seconds(120)});
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "data_parallel_mlp FAILED: %s\n", e.what());
    return 1;
  }
  return 0;
}
