// ddp_mlp — a LibTorch MLP trained data-parallel with
// troupe_torch::distributed_data_parallel: each rank holds a replica
// (torch::nn::Sequential), trains on its slice of every minibatch, and
// autograd's hooks hand each layer's gradients to troupe's reducer, which
// averages a bucket while the backward of the earlier layers goes on. Rank 0
// prints the loss per epoch and checks that the ranks reach the loss of one
// process trained on the whole batches.
//
//   troupe-run -n 4 ddp_mlp [--epochs 10] [--hook none|fp16|bf16|powersgd]
//   ddp_mlp --ranks 4        (ranks as threads of one process)

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <troupe/default_hooks.hpp>
#include <troupe/launch.hpp>
#include <troupe/powersgd.hpp>
#include <troupe/troupe.hpp>
#include <troupe_torch/distributed_data_parallel.hpp>

#include <cmath>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>

namespace {

struct options {
  int ranks = 4;
  int epochs = 10;
  std::string hook = "none";
};

constexpr int samples = 960, features = 16, outputs = 4, batch = 96;

at::Generator generator(std::uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

/// Synthetic regression: inputs in [-1, 1), targets from a fixed random "teacher".
std::pair<at::Tensor, at::Tensor> make_data() {
  auto g = generator(2024);
  auto x = at::rand({samples, features}, g) * 2 - 1;
  auto w1 = at::randn({features, 32}, g) / 4, w2 = at::randn({32, outputs}, g) / 4;
  return {x, at::tanh(x.matmul(w1)).matmul(w2)};
}

torch::nn::Sequential make_model() {
  // One start for every replica and for the reference. The seed and the
  // draws of the initial weights go to torch's one global generator, which
  // the ranks (threads of this process) share: one at a time, or a rank's
  // draws interleave with another's and its start differs.
  static std::mutex global_generator;
  std::lock_guard<std::mutex> g{global_generator};
  torch::manual_seed(1);
  return torch::nn::Sequential(torch::nn::Linear(features, 64), torch::nn::ReLU(),
                               torch::nn::Linear(64, 64), torch::nn::ReLU(),
                               torch::nn::Linear(64, outputs));
}

float mse(const at::Tensor& y, const at::Tensor& t) {
  return torch::nn::functional::mse_loss(y, t).item<float>();
}

/// One process on the whole batches: the loss the ranks must reach.
float train_alone(const options& o, const at::Tensor& x, const at::Tensor& t) {
  auto net = make_model();
  torch::optim::SGD opt{net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};
  for (int e = 0; e < o.epochs; ++e)
    for (int k = 0; k < samples / batch; ++k) {
      opt.zero_grad();
      torch::nn::functional::mse_loss(net->forward(x.slice(0, k * batch, (k + 1) * batch)),
                                      t.slice(0, k * batch, (k + 1) * batch))
          .backward();
      opt.step();
    }
  at::NoGradGuard no_grad;
  return mse(net->forward(x), t);
}

void train_rank(troupe::world& w, const options& o, const at::Tensor& x, const at::Tensor& t,
                float reference) {
  auto& pg = w.default_group();
  const int n = w.size(), r = w.rank(), mine = batch / n;
  auto net = make_model();
  troupe_torch::ddp_options ddp_opts;
  ddp_opts.bucket_cap_bytes = 16 * 1024;  // a few buckets: the last layers go first
  troupe_torch::distributed_data_parallel<torch::nn::SequentialImpl> ddp{net.ptr(), pg, ddp_opts};
  if (o.hook == "fp16") ddp.register_comm_hook(troupe::fp16_compress_hook(pg));
  if (o.hook == "bf16") ddp.register_comm_hook(troupe::bf16_compress_hook(pg));
  if (o.hook == "powersgd")
    ddp.register_comm_hook(
        troupe::powersgd_hook(pg, std::make_shared<troupe::powersgd_state>(troupe::powersgd_options{
                                      .matrix_approximation_rank = 4, .start_powersgd_iter = 10})));
  torch::optim::SGD opt{net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};
  if (r == 0)
    std::printf("%d ranks, %zu buckets, hook %s, %d samples per rank per step\n", n,
                ddp.reducer().bucket_count(), o.hook.c_str(), mine);
  float loss = 0;
  for (int e = 0; e < o.epochs; ++e) {
    for (int k = 0; k < samples / batch; ++k) {
      const int first = k * batch + r * mine;
      opt.zero_grad();
      auto y = ddp.forward(x.slice(0, first, first + mine));
      torch::nn::functional::mse_loss(y, t.slice(0, first, first + mine)).backward();
      opt.step();  // the gradients are the averages over the ranks
    }
    // The loss on the whole data: each rank measures its share, an allreduce averages.
    at::NoGradGuard no_grad;
    const int share = samples / n;
    auto l = troupe::tensor::from_vector<float>(
        {mse(net->forward(x.slice(0, r * share, (r + 1) * share)),
             t.slice(0, r * share, (r + 1) * share))});
    pg.allreduce(l, troupe::reduce_op::AVG).wait();
    loss = l.to_vector<float>()[0];
    if (r == 0) std::printf("epoch %2d  loss %.6f\n", e + 1, loss);
  }
  if (r != 0) return;
  const double gap = std::fabs(loss - reference) / reference;
  std::printf("final loss %.6f; one process on the whole data: %.6f (relative gap %.1e)\n", loss,
              reference, gap);
  const double allowed = o.hook == "powersgd" ? 0.2 : o.hook == "bf16" ? 2e-2 : 1e-3;
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
  if (o.hook != "none" && o.hook != "fp16" && o.hook != "bf16" && o.hook != "powersgd")
    throw std::invalid_argument("unknown hook '" + o.hook + "' (none, fp16, bf16, powersgd)");
  return o;
}

void check_size(int n) {
  if (n < 1 || batch % n != 0 || samples % n != 0)
    throw std::invalid_argument("the number of ranks must divide " + std::to_string(batch));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto o = parse(argc, argv);
    at::set_num_threads(1);  // one core per rank
    auto [x, t] = make_data();
    const float reference = train_alone(o, x, t);
    // One rank per process when a launcher (troupe-run, mpirun, srun)
    // started this one, else the ranks as threads of this process.
    troupe::run_job(o.ranks,
                    [&](troupe::world& w, bool) {
                      check_size(w.size());
                      train_rank(w, o, x, t, reference);
                    },
                    {.timeout = std::chrono::seconds(120)});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_mlp FAILED: %s\n", e.what());
    return 1;
  }
  return 0;
}
