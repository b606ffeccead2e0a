// ddp_uneven_inputs — ranks with different amounts of data train one model
// with troupe_torch::distributed_data_parallel inside join(): a rank whose
// data ran out keeps answering the others' collectives (with zero
// gradients) until every rank is done, and all end with the same model.
// Rank r holds 2 + r batches; the gradients are averaged over the ranks
// still training (divide_by_initial_world_size off). Rank 0 prints how many
// steps each rank took and checks that every rank ends with its parameters.
//
//   troupe-run -n 4 ddp_uneven_inputs
//   ddp_uneven_inputs --ranks 4        (ranks as threads of one process)

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <troupe/launch.hpp>
#include <troupe/troupe.hpp>
#include <troupe_torch/distributed_data_parallel.hpp>
#include <troupe_torch/tensor.hpp>

#include <atomic>
#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  int ranks = 4;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--ranks") ranks = std::stoi(argv[i + 1]);
  at::set_num_threads(1);
  std::atomic<int> wrong{0};
  troupe::run_job(ranks, [&](troupe::world& w, bool) {
    auto& pg = w.default_group();
    const int r = w.rank();
    auto model = torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                                       torch::nn::Linear(16, 1));
    troupe_torch::distributed_data_parallel<torch::nn::SequentialImpl> ddp{model.ptr(), pg};
    torch::optim::SGD opt{model->parameters(), 0.05};

    int steps = 0;
    troupe_torch::join_options o;
    o.divide_by_initial_world_size = false;
    ddp.join(
        [&] {
          for (int k = 0; k < 2 + r; ++k) {  // this rank's batches
            auto g = at::make_generator<at::CPUGeneratorImpl>(100 * r + k);
            auto x = at::randn({16, 8}, g);
            opt.zero_grad();
            torch::nn::functional::mse_loss(ddp.forward(x), x.sum(1, true)).backward();
            opt.step();
            ++steps;
          }
        },
        o);

    // Every rank holds rank 0's parameters.
    auto steps_of = troupe::tensor::from_vector<std::int32_t>({steps});
    auto all_steps = troupe::tensor::zeros({w.size()}, troupe::dtype::int32);
    pg.allgather_into_tensor(all_steps, steps_of).wait();
    for (const auto& p : model->parameters()) {
      auto ref = p.detach().clone();
      pg.broadcast(troupe_torch::to_troupe(ref), 0).wait();
      if (!at::equal(ref, p.detach())) ++wrong;
    }
    if (r == 0) {
      std::printf("steps per rank:");
      for (auto s : all_steps.to_vector<std::int32_t>()) std::printf(" %d", s);
      std::printf("\n");
    }
  });
  std::printf(wrong ? "ranks differ\n" : "every rank ends with the same model\n");
  return wrong ? 1 : 0;
}
