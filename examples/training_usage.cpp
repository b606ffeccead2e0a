// training_usage — the Training example of README.md: four ranks in one
// process average their gradients with troupe::reducer, through a float16
// comm hook, each bucket as soon as the backward marks its gradients ready.
#include <troupe/default_hooks.hpp>
#include <troupe/reducer.hpp>
#include <troupe/troupe.hpp>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <latch>
#include <thread>
#include <vector>

int main() {
  auto store = std::make_shared<troupe::hash_store>();
  std::atomic<int> wrong{0};
  std::latch done{4};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.emplace_back([store, r, &wrong, &done] {
      troupe::world w{"actor", store, r, /*world_size=*/4};
      auto& pg = w.default_group();
      // The gradients of a layer's weight and bias, which a backward fills.
      auto weight_grad = troupe::tensor::zeros({2, 3}, troupe::dtype::float32);
      auto bias_grad = troupe::tensor::zeros({2}, troupe::dtype::float32);
      troupe::reducer reducer{pg, {weight_grad, bias_grad}};  // collective: every rank makes one
      reducer.register_comm_hook(troupe::fp16_compress_hook(pg));
      for (int step = 0; step < 3; ++step) {
        std::fill_n(bias_grad.data_as<float>(), 2, float(r));  // the backward, last parameter first
        reducer.mark_ready(1);
        std::fill_n(weight_grad.data_as<float>(), 6, float(r + step));
        reducer.mark_ready(0);
        reducer.finish_step();  // both now hold the mean over the ranks
        if (bias_grad.to_vector<float>() != std::vector<float>(2, 1.5f) ||
            weight_grad.to_vector<float>() != std::vector<float>(6, 1.5f + step))
          ++wrong;
      }
      done.arrive_and_wait();  // keep w alive until every rank is done with it
    });
  for (auto& t : ranks) t.join();
  std::cout << (wrong ? "wrong mean\n" : "mean gradients on every rank\n");
  return wrong ? 1 : 0;
}
