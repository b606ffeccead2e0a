// distributed_data_parallel's logging data against what torch 1.13's own
// DDP reported on gloo for the same model and steps
// (data/torch_ddp_reference.txt, written by torch_ddp_reference.py): every
// key torch reports, at construction and after each step, on both ranks.

#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <set>
#include <string>

#include "troupe_torch/doctest.hpp"  // after the torch headers, before check_error.hpp

#include "check_error.hpp"
#include "ddp_test_support.hpp"
#include "troupe/default_hooks.hpp"
#include "troupe/testing.hpp"
#include "troupe_torch/distributed_data_parallel.hpp"
#include "troupe_torch/sync_batch_norm.hpp"

namespace {

/// The script's LogNet: Linear 64 -> 1024 -> 512 -> 8 with ReLUs, and an
/// unused Linear 8 -> 8 when asked.
struct LogNetImpl : torch::nn::Module {
  torch::nn::Sequential net{nullptr};
  torch::nn::Linear unused{nullptr};
  explicit LogNetImpl(bool with_unused) {
    net =
        register_module("net", torch::nn::Sequential(torch::nn::Linear(64, 1024), torch::nn::ReLU(),
                                                     torch::nn::Linear(1024, 512),
                                                     torch::nn::ReLU(), torch::nn::Linear(512, 8)));
    if (with_unused) unused = register_module("unused", torch::nn::Linear(8, 8));
    ddp_test::init_params(*this, 11);
  }
  at::Tensor forward(const at::Tensor& x) { return net->forward(x); }
};

struct logging_scenario {
  logging_scenario(std::string n, std::string s, bool u = false)
      : name(std::move(n)), steps(std::move(s)), unused(u) {}
  std::string name;
  std::string steps;  // S synchronised, N under no_sync
  bool unused = false;
  troupe_torch::ddp_options opts;
};

/// Our report's keys and values as torch formats them ("i"/"s" tagged).
std::map<std::string, std::pair<char, std::string>> flatten(
    const troupe_torch::ddp_logging_data& d) {
  std::map<std::string, std::pair<char, std::string>> r;
  for (const auto& [k, v] : d.strs_map()) r[k] = {'s', v};
  for (const auto& [k, v] : d.ints_map()) r[k] = {'i', std::to_string(v)};
  return r;
}

const std::set<std::string> run_dependent = {"master_addr", "master_port",
                                             "torch_distributed_debug", "cuda_visible_devices"};

void compare(const troupe_torch::ddp_logging_data& d, const std::string& prefix,
             const std::string& backend, const std::string& torch_rebuilt_sizes) {
  CAPTURE(prefix);
  const auto want = ddp_test::reference_under(prefix);
  REQUIRE(!want.empty());
  const auto ours = flatten(d);
  for (const auto& [key, e] : want) {
    CAPTURE(key);
    auto it = ours.find(key);
    REQUIRE_MESSAGE(it != ours.end(), "torch reports " << key << ", troupe does not");
    CHECK(it->second.first == e.kind);
    if (e.text == "present") continue;  // times and environment: only there
    if (key == "backend_name") {
      CHECK(it->second.second == backend);  // "gloo" there
    } else if (key == "bucket_sizes" && !d.find_unused_parameters) {
      // torch 1.13 starts with one bucket and rebuilds it after the first
      // iteration; troupe buckets by c10d's rule from the start, which is
      // what torch's rebuild gives for this order.
      CHECK(it->second.second == torch_rebuilt_sizes);
    } else if (key == "bucket_sizes") {
      // With find_unused_parameters torch 1.13 assigns in definition order
      // (its 1 MiB bucket last) and never rebuilds; troupe in reverse order:
      // unused.bias, unused.weight, net.4.bias, net.4.weight, net.2.bias and
      // net.2.weight (32 + 256 + 32 + 16384 + 2048 + 2097152 bytes) fill the
      // first bucket past 1 MiB, net.0's 4096 + 262144 bytes the second.
      CHECK(e.text == "18752, 2363392");
      CHECK(it->second.second == "2115904, 266240");
    } else {
      CHECK(it->second.second == e.text);
    }
  }
  for (const auto& [key, v] : ours)
    CHECK_MESSAGE(want.count(key), "troupe reports " << key << ", torch does not");
}

void run_scenario(troupe::world& w, const logging_scenario& s) {
  CAPTURE(s.name);
  auto& pg = w.default_group();
  const int r = w.rank();
  auto model = std::make_shared<LogNetImpl>(s.unused);
  troupe_torch::distributed_data_parallel<LogNetImpl> ddp{model, pg, s.opts};
  const std::string base = "logging." + s.name + ".";
  const std::string rank = ".rank" + std::to_string(r) + ".";
  const auto found = ddp_test::reference().find(base + "step" + std::to_string(s.steps.size()) +
                                                ".rank0.rebuilt_bucket_sizes");
  const std::string rebuilt = found == ddp_test::reference().end() ? "" : found->second.text;
  compare(ddp.logging_data(), base + "construction" + rank, pg.backend_name(), rebuilt);
  for (std::size_t k = 0; k < s.steps.size(); ++k) {
    auto g = ddp_test::gen(1000 * r + k);
    auto x = at::randn({4, 64}, g);
    auto y = at::randn({4, 8}, g);
    if (s.steps[k] == 'N') {
      auto guard = ddp.no_sync();
      torch::nn::functional::mse_loss(ddp.forward(x), y).backward();
    } else {
      torch::nn::functional::mse_loss(ddp.forward(x), y).backward();
      ddp_test::sgd(*model, 0.01);
    }
    compare(ddp.logging_data(), base + "step" + std::to_string(k + 1) + rank, pg.backend_name(),
            rebuilt);
  }

  // The sampled times: measured on this rank's clock, in order.
  const auto d = ddp.logging_data();
  REQUIRE(d.has_runtime_stats);
  CHECK(d.forward_compute_time_start > 0);
  CHECK(d.forward_compute_time_start <= d.backward_compute_time_start);
  CHECK(d.backward_compute_time_start <= d.backward_compute_time_end);
  CHECK(d.backward_comm_time_start > 0);
  CHECK(d.backward_comm_time_start <= d.backward_comm_time_end);
  CHECK(d.backward_compute_time_end <= d.backward_comm_time_end);
  CHECK(d.forward_compute_time == d.backward_compute_time_start - d.forward_compute_time_start);
  CHECK(d.backward_comm_time == d.backward_comm_time_end - d.backward_comm_time_start);
  CHECK(d.avg_backward_comm_time > 0);
}

}  // namespace

TEST_CASE("distributed_data_parallel's logging data is torch 1.13's for the same model") {
  at::set_num_threads(1);
  troupe::testing::run_ranks(
      2,
      [](troupe::world& w) {
        logging_scenario def{"default", "SSS"};
        run_scenario(w, def);
        logging_scenario unused{"unused_views", "SSS", true};
        unused.opts.find_unused_parameters = true;
        unused.opts.gradient_as_bucket_view = true;
        run_scenario(w, unused);
        logging_scenario stat{"static", "SSSS"};
        stat.opts.static_graph = true;
        run_scenario(w, stat);
        logging_scenario nosync{"no_sync", "SSNS"};
        run_scenario(w, nosync);
      },
      ddp_test::quick());
}

TEST_CASE("distributed_data_parallel's logging data: hooks, SyncBatchNorm, the sample rate") {
  at::set_num_threads(1);
  troupe::testing::run_ranks(
      2,
      [](troupe::world& w) {
        auto& pg = w.default_group();
        {
          auto model = std::make_shared<LogNetImpl>(false);
          troupe_torch::distributed_data_parallel<LogNetImpl> ddp{model, pg};
          CHECK(ddp.logging_data().strs_map().count("comm_hook") == 0);
          auto hook = troupe::allreduce_hook(pg);
          ddp.register_comm_hook(hook);
          CHECK(ddp.logging_data().comm_hook == hook.name);
          CHECK(ddp.logging_data().strs_map().at("comm_hook") == hook.name);
          // Sampled at 1..10, then every 4th: after 14 steps the last sample is 12.
          ddp.set_ddp_runtime_logging_sample_rate(4);
          for (int k = 0; k < 14; ++k) ddp.forward(at::ones({2, 64})).sum().backward();
          CHECK(ddp.logging_data().iteration == 12);
          troupe::test::check_error([&] { ddp.set_ddp_runtime_logging_sample_rate(0); },
                                    troupe::errc::invalid_argument,
                                    {"set_ddp_runtime_logging_sample_rate", "greater than 1", "0"});
        }
        {
          auto model =
              torch::nn::Sequential(torch::nn::Linear(4, 4),
                                    troupe_torch::SyncBatchNorm(
                                        troupe_torch::SyncBatchNormOptions(4).process_group(&pg)));
          troupe_torch::distributed_data_parallel<torch::nn::SequentialImpl> ddp{model, pg};
          const auto d = ddp.logging_data();
          CHECK(d.has_sync_bn);
          CHECK(d.module_name == "Sequential");
          CHECK(d.ints_map().at("has_sync_bn") == 1);
          CHECK(d.backend_name == pg.backend_name());
        }
      },
      ddp_test::quick());
}
