// reducer_bench — the reducer on a model of about 25 M float32 parameters in
// 100 tensors (50 layers of a 1000 x 500 weight and a 1000 bias): the time
// of a training step's gradient synchronisation when it overlaps a simulated
// backward (each gradient marked ready as it is produced, last layer first)
// against synchronising after the backward, with one allreduce per tensor
// or with one flat allreduce; also the reducer with fp16_compress_hook and
// with PowerSGD at rank 4.
//
//   reducer_bench --ranks 2              ranks as threads of one process
//   troupe-run -n 2 reducer_bench        one rank per process (shared memory)
//   options: --steps K (timed, default 5) --compute-us-per-mib U (default 400)
//            --layers L (default 50) --check-only (1 layer, 1 step, values only)
//            --modes per_tensor,flat,after,overlap,view,fp16,powersgd (default all)
//
// The simulated backward writes each gradient (a pass over its memory) and
// then spins U microseconds per MiB of it, standing for the arithmetic of a
// real backward. A step's time is the slowest rank's, from a barrier to the
// averaged gradients; the table shows the median over the timed steps and
// the exposed synchronisation: step time minus the backward alone.

#include <troupe/default_hooks.hpp>
#include <troupe/launch.hpp>
#include <troupe/powersgd.hpp>
#include <troupe/reducer.hpp>
#include <troupe/testing.hpp>
#include <troupe/troupe.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using troupe::tensor;
using clock_type = std::chrono::steady_clock;

struct options {
  int ranks = 2;
  int steps = 5;
  int layers = 50;
  double compute_us_per_mib = 400;
  bool check_only = false;
  /// Which synchronisations to time (empty: all): per_tensor, flat, overlap,
  /// after, view, fp16, powersgd.
  std::vector<std::string> modes;
  bool wants(const std::string& m) const {
    return modes.empty() || std::find(modes.begin(), modes.end(), m) != modes.end();
  }
};

constexpr std::int64_t rows = 1000, cols = 500;

/// The gradients' shapes: weight, bias per layer.
std::vector<troupe::shape_t> shapes(const options& o) {
  std::vector<troupe::shape_t> r;
  for (int l = 0; l < o.layers; ++l) {
    r.push_back({rows, cols});
    r.push_back({rows});
  }
  return r;
}

/// Gradient element k of tensor t on `rank`: exact in float16 after / ranks.
float value(int rank, std::size_t t, std::int64_t k) {
  return static_cast<float>(rank + 1) *
         (1.0f + 0.125f * static_cast<float>((k + static_cast<std::int64_t>(t)) & 7));
}

void spin(double us) {
  const auto until =
      clock_type::now() + std::chrono::nanoseconds(static_cast<std::int64_t>(us * 1000));
  while (clock_type::now() < until) {
  }
}

/// The simulated backward: last tensor first; ready(t) once tensor t is written.
void backward(const options& o, int rank, const troupe::tensor_list& grads,
              const std::function<void(std::size_t)>& ready) {
  for (std::size_t t = grads.size(); t-- > 0;) {
    auto* g = grads[t].data_as<float>();
    for (std::int64_t k = 0; k < grads[t].numel(); ++k) g[k] = value(rank, t, k);
    spin(o.compute_us_per_mib * static_cast<double>(grads[t].nbytes()) / (1 << 20));
    ready(t);
  }
}

/// Whether every gradient holds the mean over ranks (sampled; `tol` relative).
bool check(const troupe::tensor_list& grads, int n, double tol) {
  for (std::size_t t = 0; t < grads.size(); ++t) {
    const auto* g = grads[t].data_as<float>();
    for (std::int64_t k = 0; k < grads[t].numel(); k += 997) {
      const double want = (n + 1) / 2.0 * value(0, t, k);
      if (std::fabs(g[k] - want) > tol * want) return false;
    }
  }
  return true;
}

double ms(clock_type::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

/// The slowest rank's time.
double slowest(troupe::process_group& pg, double mine) {
  auto t = tensor::from_vector<double>({mine});
  pg.allreduce(t, troupe::reduce_op::MAX).wait();
  return t.to_vector<double>()[0];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct row {
  std::string mode;
  double step_ms;
  bool correct;
  std::string note;
};

/// Times `steps` steps of `one_step` (after `warmup` untimed ones).
double time_steps(troupe::process_group& pg, int warmup, int steps,
                  const std::function<void()>& one_step) {
  std::vector<double> times;
  for (int s = 0; s < warmup + steps; ++s) {
    pg.barrier().wait();
    const auto t0 = clock_type::now();
    one_step();
    const double t = slowest(pg, ms(clock_type::now() - t0));
    if (s >= warmup) times.push_back(t);
  }
  return median(times);
}

void run(troupe::world& w, const options& o, bool launched_here) {
  auto& pg = w.default_group();
  const int n = w.size(), rank = w.rank();
  const int steps = o.check_only ? 1 : o.steps;
  troupe::tensor_list grads;
  for (auto& s : shapes(o)) grads.push_back(tensor::zeros(s, troupe::dtype::float32));
  std::size_t params = 0;
  for (auto& g : grads) params += static_cast<std::size_t>(g.numel());
  std::vector<row> rows_out;
  auto nothing = [](std::size_t) {};

  // The backward alone.
  const double alone = time_steps(pg, 1, steps, [&] { backward(o, rank, grads, nothing); });
  rows_out.push_back({"backward alone (no synchronisation)", alone, true, ""});

  // After the backward: one allreduce per tensor, all in flight, then wait.
  if (o.wants("per_tensor")) {
    const double per_tensor = time_steps(pg, 1, steps, [&] {
      backward(o, rank, grads, nothing);
      std::vector<troupe::work> ws;
      for (auto& g : grads) ws.push_back(pg.allreduce(g, troupe::reduce_op::AVG));
      for (auto& x : ws) x.wait();
    });
    rows_out.push_back(
        {"after backward, one allreduce per tensor (" + std::to_string(grads.size()) + " calls)",
         per_tensor, check(grads, n, 1e-6), ""});
  }

  // After the backward: pack into one flat buffer, one allreduce, unpack.
  double flat_ms = 0;
  if (o.wants("flat")) {
    auto flat = tensor::zeros({static_cast<std::int64_t>(params)}, troupe::dtype::float32);
    flat_ms = time_steps(pg, 1, steps, [&] {
      backward(o, rank, grads, nothing);
      std::int64_t off = 0;
      for (auto& g : grads) {
        flat.flat_slice(off, g.numel()).copy_from(g);
        off += g.numel();
      }
      pg.allreduce(flat, troupe::reduce_op::AVG).wait();
      off = 0;
      for (auto& g : grads) {
        g.copy_from(flat.flat_slice(off, g.numel()));
        off += g.numel();
      }
    });
    rows_out.push_back({"after backward, one flat allreduce (copy in and out)", flat_ms,
                        check(grads, n, 1e-6), ""});
  }

  // The reducer: buckets reduced as the backward marks gradients ready.
  auto with_reducer = [&](const std::string& key, const std::string& mode,
                          troupe::reducer_options ro, const std::string& hook_name, double tol) {
    if (!o.wants(key)) return;
    troupe::reducer red{pg, grads, ro};
    std::shared_ptr<troupe::powersgd_state> state;
    if (hook_name == "fp16") red.register_comm_hook(troupe::fp16_compress_hook(pg));
    if (hook_name == "powersgd") {
      state = std::make_shared<troupe::powersgd_state>(
          troupe::powersgd_options{.matrix_approximation_rank = 4, .start_powersgd_iter = 2});
      red.register_comm_hook(troupe::powersgd_hook(pg, state));
    }
    auto g = red.gradients();
    const bool overlap = key != "after";
    const double t = time_steps(pg, hook_name == "powersgd" ? 3 : 1, steps, [&] {
      backward(o, rank, g, [&](std::size_t i) {
        if (overlap) red.mark_ready(i);
      });
      if (!overlap)
        for (std::size_t i = g.size(); i-- > 0;) red.mark_ready(i);
      red.finish_step();
    });
    std::string note = std::to_string(red.bucket_count()) + " buckets";
    if (state) {
      char buf[64];
      std::snprintf(buf, sizeof buf, ", %.0fx fewer elements",
                    state->compression_stats().compression_rate);
      note += buf;
    }
    rows_out.push_back({mode, t, tol < 0 ? true : check(g, n, tol), note});
  };
  with_reducer("after", "reducer, every gradient marked after the backward", {}, "", 1e-6);
  with_reducer("overlap", "reducer, overlapped (allreduce AVG per bucket)", {}, "", 1e-6);
  with_reducer("view", "reducer, overlapped, gradient_as_bucket_view",
               {.gradient_as_bucket_view = true}, "", 1e-6);
  with_reducer("fp16", "reducer + fp16_compress_hook", {}, "fp16", 1e-3);
  with_reducer("powersgd", "reducer + PowerSGD rank 4", {}, "powersgd", -1);

  if (rank != 0) return;
  std::printf(
      "\n%d ranks (%s), %zu tensors, %.1f M float32 parameters (%.0f MiB), backward spins "
      "%.0f us/MiB, median of %d steps\n\n",
      n, launched_here ? "one process per rank" : "threads of one process", grads.size(),
      params / 1e6, params * 4.0 / (1 << 20), o.compute_us_per_mib, steps);
  std::printf("| synchronisation | step ms | exposed ms | exposed / flat's | values | notes |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (std::size_t k = 0; k < rows_out.size(); ++k) {
    const auto& r = rows_out[k];
    char exposed[32] = "-", ratio[32] = "-";
    if (k > 0) {
      std::snprintf(exposed, sizeof exposed, "%.1f", r.step_ms - alone);
      if (flat_ms > 0)
        std::snprintf(ratio, sizeof ratio, "%.2f", (r.step_ms - alone) / (flat_ms - alone));
    }
    std::printf("| %s | %.1f | %s | %s | %s | %s |\n", r.mode.c_str(), r.step_ms, exposed, ratio,
                r.correct ? "ok" : "WRONG", r.note.c_str());
  }
  std::fflush(stdout);
  bool all = true;
  for (auto& r : rows_out) all = all && r.correct;
  if (!all) throw std::runtime_error("some synchronisation produced wrong gradients");
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) throw std::invalid_argument("missing value after " + a);
      return std::string(argv[++i]);
    };
    if (a == "--ranks")
      o.ranks = std::stoi(next());
    else if (a == "--steps")
      o.steps = std::stoi(next());
    else if (a == "--layers")
      o.layers = std::stoi(next());
    else if (a == "--compute-us-per-mib")
      o.compute_us_per_mib = std::stod(next());
    else if (a == "--check-only")
      o.check_only = true;
    else if (a == "--modes") {
      std::string list = next();
      for (std::size_t at = 0; at <= list.size();) {
        auto comma = std::min(list.find(',', at), list.size());
        o.modes.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
    } else
      throw std::invalid_argument("unknown argument " + a);
  }
  if (o.check_only) o.layers = 1;
  if (o.ranks < 1 || o.steps < 1 || o.layers < 1)
    throw std::invalid_argument("--ranks, --steps, --layers >= 1");
  return o;
}

bool launched() {
  return std::getenv("RANK") || std::getenv("OMPI_COMM_WORLD_RANK") || std::getenv("SLURM_PROCID");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto o = parse(argc, argv);
    if (launched()) {
      auto w = troupe::init_world({.timeout = std::chrono::seconds(300)});
      run(*w, o, true);
      w->default_group().barrier().wait();
    } else {
      troupe::testing::run_ranks(o.ranks, [&](troupe::world& w) { run(w, o, false); },
                                 {.timeout = std::chrono::seconds(300)});
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reducer_bench FAILED: %s\n", e.what());
    return 1;
  }
  return 0;
}
