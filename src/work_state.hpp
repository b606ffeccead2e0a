#pragma once
// The shared state behind troupe::work.

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/work.hpp"

namespace troupe::detail {

struct work_state {
  std::mutex mtx;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  tensor_list outputs;
  int source_rank = -1;
  std::atomic<std::uint64_t> seq{0};
  std::string op;
  std::string group;
  std::vector<std::function<void(const work&)>> callbacks;
};

}  // namespace troupe::detail
