// barrier's device_ids with a GPU (label gpu, skipped without a device):
// the devices this process sees are accepted, the first of them is the
// device the nccl backend's barrier runs on, and the actor backend's
// barrier (which moves no tensor) accepts and ignores them, as Gloo's.

#include <doctest/doctest.h>

#include "check_error.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using troupe::test::check_error;

TEST_CASE("the actor backend's barrier accepts the devices of this process") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    pg.barrier({.device_ids = {0}}).wait();
    check_error(
        [&] {
          pg.barrier({.device_ids = {0, 0}});
        },
        errc::invalid_argument, {"appears twice"});
    check_error([&] { pg.barrier({.device_ids = {cuda_device_count()}}); }, errc::invalid_argument,
                {"names no device of this process"});
    CHECK(pg.sequence_number() == 1);
  });
}

TEST_CASE("the nccl backend's barrier runs on device_ids[0], the group's device") {
  if (!is_backend_available("nccl")) return;
  testing::run_options o;
  o.backend = "cpu:actor,cuda:nccl";
  testing::run_ranks(
      1,
      [](world& w) {
        auto g = w.new_group({0}, {.backend = "cuda:nccl"});
        g->barrier({.device_ids = {0}}).wait();
        g->barrier().wait();
        CHECK(g->sequence_number() == 2);
        auto t = tensor::zeros({4}, dtype::float32, device::cuda(0));
        g->allreduce(t).wait();
        if (cuda_device_count() > 1)  // the communicator lives on cuda:0 now
          check_error([&] { g->barrier({.device_ids = {1}}); }, errc::invalid_argument,
                      {"barrier", "cuda:0", "cuda:1"});
      },
      o);
}
