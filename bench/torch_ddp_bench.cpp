// torch_ddp_bench — one training step of troupe's LibTorch
// troupe_torch::distributed_data_parallel on the models of
// bench/torch_ddp_bench.py (the same MLPs, batch, loss and optimizer), the
// C++ side of the comparison that bench/run_torch_ddp_bench.py prints.
//
//   troupe-run -n 2 torch_ddp_bench [--rounds 7] [--warmup 2] [--models large,small]
//                                   [--out FILE] [--check-only]
//   torch_ddp_bench --ranks 2        (ranks as threads of one process)
//
// Models: three Linear layers with ReLUs between them, "large" (1024 -> 4096
// -> 4096 -> 1024, 25.2 M float32 parameters) and "small" (64 -> 256 -> 256
// -> 64, 99 k); 32 samples per rank per step, mse loss, SGD (lr 0.01,
// momentum 0.9), one torch thread per rank, DDP's default buckets (1 MiB
// first, then 25 MiB). Rows, each round timing every row once: "ddp troupe",
// a step (zero_grad, forward, backward with the gradient synchronisation,
// optimizer step) of the DDP replica; "local", the same step on a copy of the
// model without DDP; "ddp nocomm", the DDP step with a comm hook that hands
// every bucket back at once (what DDP itself adds: the gradients copied into
// the buckets and back out). A time runs from a barrier to the end of the
// step; a round's time is the slowest rank's; the table shows medians over
// the rounds, "exposed" the DDP step minus the local step, "exposed nocomm"
// the nocomm step minus the local step, "exposed comm" the DDP step minus
// the nocomm step.
//
// Checks after the timed steps: every rank holds rank 0's parameters; with
// --check-only (small layers, one timed round) also that they match one
// process trained on every rank's samples (allclose).

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

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

struct options {
  int ranks = 2;
  int rounds = 7;
  int warmup = 2;
  std::vector<std::string> models = {"large", "small"};
  bool check_only = false;
  std::string out;
};

struct dims {
  std::int64_t in, hidden, out;
};

constexpr std::int64_t batch = 32;
constexpr int data_batches = 4;

dims dims_of(const std::string& name, bool check_only) {
  if (name == "large") return check_only ? dims{256, 640, 256} : dims{1024, 4096, 1024};
  if (name == "small") return check_only ? dims{16, 32, 8} : dims{64, 256, 64};
  throw std::invalid_argument("unknown model '" + name + "' (large, small)");
}

torch::nn::Sequential make_model(const dims& d) {
  // One start for every rank and every replica (ranks as threads share the generator).
  static std::mutex m;
  std::lock_guard<std::mutex> lock{m};
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(d.in, d.hidden), torch::nn::ReLU(),
                               torch::nn::Linear(d.hidden, d.hidden), torch::nn::ReLU(),
                               torch::nn::Linear(d.hidden, d.out));
}

/// Rank `rank`'s samples of step k (k < data_batches), as the Python benchmark seeds them.
std::vector<std::pair<at::Tensor, at::Tensor>> make_batches(const dims& d, int rank) {
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  for (int k = 0; k < data_batches; ++k) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(1000 * k + rank);
    auto x = at::randn({batch, d.in}, g);
    auto y = at::randn({batch, d.out}, g);
    out.emplace_back(x, y);
  }
  return out;
}

torch::optim::SGD make_sgd(const std::vector<at::Tensor>& params) {
  return torch::optim::SGD{params, torch::optim::SGDOptions(0.01).momentum(0.9)};
}

double ms(clock_type::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;  // as Python's statistics.median
}

/// The slowest rank's value of each entry.
std::vector<double> slowest(troupe::process_group& pg, const std::vector<double>& mine) {
  auto t = troupe::tensor::from_vector<double>(mine);
  pg.allreduce(t, troupe::reduce_op::MAX).wait();
  return t.to_vector<double>();
}

double timed(troupe::process_group& pg, const std::function<void()>& fn) {
  pg.barrier().wait();
  const auto t0 = clock_type::now();
  fn();
  return ms(clock_type::now() - t0);
}

struct model_result {
  std::string name;
  std::int64_t params = 0;
  int steps = 0;
  std::map<std::string, std::vector<double>> times;  // row: ms per round
};

model_result bench_model(troupe::world& w, const options& o, const std::string& name) {
  auto& pg = w.default_group();
  const int rank = w.rank(), n = w.size();
  const dims d = dims_of(name, o.check_only);
  auto net = make_model(d);
  troupe_torch::distributed_data_parallel<torch::nn::SequentialImpl> ddp{net.ptr(), pg};
  auto opt = make_sgd(net->parameters());
  auto local = make_model(d);
  auto local_opt = make_sgd(local->parameters());
  auto bare = make_model(d);
  troupe_torch::distributed_data_parallel<torch::nn::SequentialImpl> nocomm{bare.ptr(), pg};
  nocomm.register_comm_hook({[](const troupe::grad_bucket& b) {
                               return troupe::work::completed("nocomm", "", {b.buffer()});
                             },
                             troupe::hook_ordering::concurrent, "nocomm"});
  auto bare_opt = make_sgd(bare->parameters());
  const auto data = make_batches(d, rank);

  model_result r;
  r.name = name;
  for (const auto& p : net->parameters()) r.params += p.numel();
  auto ddp_step = [&] {
    const auto& [x, y] = data[r.steps % data_batches];
    opt.zero_grad();
    torch::nn::functional::mse_loss(ddp.forward(x), y).backward();
    opt.step();
  };
  auto local_step = [&] {
    const auto& [x, y] = data[r.steps % data_batches];
    local_opt.zero_grad();
    torch::nn::functional::mse_loss(local->forward(x), y).backward();
    local_opt.step();
  };
  auto nocomm_step = [&] {
    const auto& [x, y] = data[r.steps % data_batches];
    bare_opt.zero_grad();
    torch::nn::functional::mse_loss(nocomm.forward(x), y).backward();
    bare_opt.step();
  };
  for (int round = 0; round < o.warmup + o.rounds; ++round) {
    const double a = timed(pg, ddp_step);
    const double b = timed(pg, local_step);
    const double c = timed(pg, nocomm_step);
    ++r.steps;
    const auto s = slowest(pg, {a, b, c});
    if (round < o.warmup) continue;
    r.times["ddp troupe"].push_back(s[0]);
    r.times["local"].push_back(s[1]);
    r.times["ddp nocomm"].push_back(s[2]);
    r.times["exposed troupe"].push_back(s[0] - s[1]);
    r.times["exposed nocomm"].push_back(s[2] - s[1]);
    r.times["exposed comm"].push_back(s[0] - s[2]);
  }

  // Every rank holds rank 0's parameters.
  at::NoGradGuard no_grad;
  for (const auto& p : net->parameters()) {
    auto ref = p.detach().clone();
    pg.broadcast(troupe_torch::to_troupe(ref), 0).wait();
    if (!at::equal(ref, p.detach()))
      throw std::runtime_error(name + ": rank " + std::to_string(rank) +
                               " has parameters that differ from rank 0's");
  }
  if (o.check_only) {
    // One process on every rank's samples of every step reaches the same parameters.
    auto alone = make_model(d);
    auto alone_opt = make_sgd(alone->parameters());
    at::GradMode::set_enabled(true);
    std::vector<std::vector<std::pair<at::Tensor, at::Tensor>>> all;
    for (int q = 0; q < n; ++q) all.push_back(make_batches(d, q));
    for (int k = 0; k < r.steps; ++k) {
      std::vector<at::Tensor> xs, ys;
      for (int q = 0; q < n; ++q) {
        xs.push_back(all[q][k % data_batches].first);
        ys.push_back(all[q][k % data_batches].second);
      }
      alone_opt.zero_grad();
      torch::nn::functional::mse_loss(alone->forward(at::cat(xs)), at::cat(ys)).backward();
      alone_opt.step();
    }
    at::GradMode::set_enabled(false);
    const auto mine = net->parameters(), ref = alone->parameters();
    for (std::size_t i = 0; i < mine.size(); ++i)
      if (!at::allclose(mine[i], ref[i], 1e-4, 1e-5))
        throw std::runtime_error(name + ": parameter " + std::to_string(i) +
                                 " differs from one process trained on every rank's samples");
  }
  return r;
}

std::string json(const std::vector<model_result>& results, int n, const options& o) {
  std::ostringstream s;
  const char* transport = std::getenv("TROUPE_TRANSPORT");
  s << "{\"procs\": " << n << ", \"transport\": \"" << (transport ? transport : "shm")
    << "\", \"batch\": " << batch << ", \"rounds\": " << o.rounds
    << ", \"check_only\": " << (o.check_only ? "true" : "false") << ", \"models\": {";
  for (std::size_t m = 0; m < results.size(); ++m) {
    const auto& r = results[m];
    s << (m ? ", " : "") << "\"" << r.name << "\": {\"params\": " << r.params
      << ", \"steps\": " << r.steps << ", \"times_ms\": {";
    bool first = true;
    for (const auto& [row, v] : r.times) {
      s << (first ? "" : ", ") << "\"" << row << "\": [";
      for (std::size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
      s << "]";
      first = false;
    }
    s << "}}";
  }
  s << "}}\n";
  return s.str();
}

void run(troupe::world& w, const options& o) {
  std::vector<model_result> results;
  for (const auto& name : o.models) {
    results.push_back(bench_model(w, o, name));
    if (w.rank() == 0)
      std::printf("%s: %lld parameters, %d steps, ranks agree\n", name.c_str(),
                  static_cast<long long>(results.back().params), results.back().steps);
  }
  if (w.rank() != 0) return;
  std::printf(
      "\n### LibTorch distributed_data_parallel step on troupe, %d processes, %lld samples per "
      "rank, median of %d rounds, slowest rank\n\n",
      w.size(), static_cast<long long>(batch), o.rounds);
  std::printf(
      "| model | params | ddp troupe ms | local ms | exposed troupe ms | exposed nocomm ms | "
      "exposed comm ms |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const auto& r : results)
    std::printf("| %s | %.3f M | %.2f | %.2f | %.2f | %.2f | %.2f |\n", r.name.c_str(),
                r.params / 1e6, median(r.times.at("ddp troupe")), median(r.times.at("local")),
                median(r.times.at("exposed troupe")), median(r.times.at("exposed nocomm")),
                median(r.times.at("exposed comm")));
  std::printf("\n");
  std::fflush(stdout);
  if (!o.out.empty()) {
    std::ofstream f{o.out};
    f << json(results, w.size(), o);
    if (!f) throw std::runtime_error("cannot write " + o.out);
  }
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--check-only") {
      o.check_only = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument("missing value after " + a);
    const std::string v = argv[++i];
    if (a == "--ranks")
      o.ranks = std::stoi(v);
    else if (a == "--rounds")
      o.rounds = std::stoi(v);
    else if (a == "--warmup")
      o.warmup = std::stoi(v);
    else if (a == "--out")
      o.out = v;
    else if (a == "--models") {
      o.models.clear();
      std::stringstream s{v};
      for (std::string m; std::getline(s, m, ',');) o.models.push_back(m);
    } else
      throw std::invalid_argument("unknown argument " + a);
  }
  for (const auto& m : o.models) dims_of(m, false);  // names it knows
  if (o.check_only) o.rounds = o.warmup = 1;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto o = parse(argc, argv);
    at::set_num_threads(1);  // one core per rank
    troupe::run_job(o.ranks, [&](troupe::world& w, bool) { run(w, o); },
                    {.timeout = std::chrono::minutes(10)});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_ddp_bench FAILED: %s\n", e.what());
    return 1;
  }
  return 0;
}
