// readme_usage — the usage example of README.md: four ranks in one process,
// each with its own troupe::world, sum a tensor with allreduce.
#include <troupe/troupe.hpp>

#include <atomic>
#include <iostream>
#include <latch>
#include <thread>
#include <vector>

int main() {
  auto store = std::make_shared<troupe::hash_store>();  // where the ranks meet
  std::atomic<int> wrong{0};
  std::latch done{4};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.emplace_back([store, r, &wrong, &done] {
      troupe::world w{"actor", store, r, /*world_size=*/4};
      auto t = troupe::tensor::from_vector<float>({1.0f * r, 2.0f});
      w.default_group().allreduce(t).wait();  // sum over the ranks, in place
      if (t.to_vector<float>() != std::vector<float>{6.0f, 8.0f}) ++wrong;
      done.arrive_and_wait();  // keep w alive until every rank is done with it
    });
  for (auto& t : ranks) t.join();
  std::cout << (wrong ? "wrong sum\n" : "sum on every rank: 6 8\n");
  return wrong ? 1 : 0;
}
