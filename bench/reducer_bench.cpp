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
//   options: --steps K (timed rounds, default 5) --compute-us-per-mib U (default 400)
//            --layers L (default 50) --check-only (1 layer, 1 step, values only)
//            --modes per_tensor,flat,after,overlap,view,fp16,powersgd (default all)
//
// The simulated backward writes each gradient (a pass over its memory) and
// then spins U microseconds per MiB of it, standing for the arithmetic of a
// real backward. A step's time is the slowest rank's, from a barrier to the
// averaged gradients. Each round times every row once, one after the other
// (the machine's slow seconds then fall on all rows alike); the table shows
// medians over the rounds of the step time and of the exposed
// synchronisation: the step's time minus the backward alone in that round.

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

/// One way of synchronising a step's gradients.
struct mode {
  mode(std::string k, std::string l, std::function<void()> s, std::function<bool()> c,
       std::function<std::string()> n)
      : key(std::move(k)),
        label(std::move(l)),
        step(std::move(s)),
        correct(std::move(c)),
        note(std::move(n)) {}
  std::string key;
  std::string label;
  std::function<void()> step;         // backward plus synchronisation
  std::function<bool()> correct;      // the gradients hold the means
  std::function<std::string()> note;  // what to say about it
  int warmup = 1;
  std::vector<double> times, exposed;  // per round: step, step - backward alone
};

/// One timed step: from a barrier to the end, the slowest rank's time.
double timed(troupe::process_group& pg, const std::function<void()>& step) {
  pg.barrier().wait();
  const auto t0 = clock_type::now();
  step();
  return slowest(pg, ms(clock_type::now() - t0));
}

void run(troupe::world& w, const options& o, bool launched_here) {
  auto& pg = w.default_group();
  const int n = w.size(), rank = w.rank();
  const int rounds = o.check_only ? 1 : o.steps;
  std::vector<mode> modes;
  auto nothing = [](std::size_t) {};
  auto fresh_grads = [&] {
    troupe::tensor_list g;
    for (auto& s : shapes(o)) g.push_back(tensor::zeros(s, troupe::dtype::float32));
    return g;
  };
  auto grads = fresh_grads();
  std::size_t params = 0;
  for (auto& g : grads) params += static_cast<std::size_t>(g.numel());

  // The baseline: the backward alone.
  modes.emplace_back(
      "alone", "backward alone (no synchronisation)", [&] { backward(o, rank, grads, nothing); },
      [] { return true; }, [] { return std::string(); });

  // After the backward: one allreduce per tensor, all in flight, then wait.
  if (o.wants("per_tensor"))
    modes.emplace_back(
        "per_tensor",
        "after backward, one allreduce per tensor (" + std::to_string(grads.size()) + " calls)",
        [&] {
          backward(o, rank, grads, nothing);
          std::vector<troupe::work> ws;
          for (auto& g : grads) ws.push_back(pg.allreduce(g, troupe::reduce_op::AVG));
          for (auto& x : ws) x.wait();
        },
        [&] { return check(grads, n, 1e-6); }, [] { return std::string(); });

  // After the backward: pack into one flat buffer, one allreduce, unpack.
  auto flat = tensor::zeros({static_cast<std::int64_t>(params)}, troupe::dtype::float32);
  if (o.wants("flat"))
    modes.emplace_back(
        "flat", "after backward, one flat allreduce (copy in and out)",
        [&] {
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
        },
        [&] { return check(grads, n, 1e-6); }, [] { return std::string(); });

  // The reducer: buckets reduced as the backward marks gradients ready (or,
  // for "after", all marked once the backward is over).
  std::vector<std::unique_ptr<troupe::reducer>> reducers;
  std::vector<troupe::tensor_list> own_grads;
  std::vector<std::shared_ptr<troupe::powersgd_state>> states;
  auto add_reducer = [&](const std::string& key, const std::string& label,
                         troupe::reducer_options ro, const std::string& hook, double tol) {
    if (!o.wants(key)) return;
    own_grads.push_back(fresh_grads());
    reducers.push_back(std::make_unique<troupe::reducer>(pg, own_grads.back(), ro));
    auto* red = reducers.back().get();
    std::shared_ptr<troupe::powersgd_state> state;
    if (hook == "fp16") red->register_comm_hook(troupe::fp16_compress_hook(pg));
    if (hook == "powersgd") {
      state = std::make_shared<troupe::powersgd_state>(
          troupe::powersgd_options{.matrix_approximation_rank = 4, .start_powersgd_iter = 2});
      red->register_comm_hook(troupe::powersgd_hook(pg, state));
      states.push_back(state);
    }
    const bool overlap = key != "after";
    auto finish_ms = std::make_shared<std::vector<double>>();  // this rank's wait in finish_step
    mode m{key, label,
           [&o, rank, red, overlap, finish_ms] {
             auto g = red->gradients();
             backward(o, rank, g, [&](std::size_t i) {
               if (overlap) red->mark_ready(i);
             });
             if (!overlap)
               for (std::size_t i = g.size(); i-- > 0;) red->mark_ready(i);
             const auto t0 = clock_type::now();
             red->finish_step();
             finish_ms->push_back(ms(clock_type::now() - t0));
           },
           [red, n, tol] { return tol < 0 || check(red->gradients(), n, tol); },
           [red, state, finish_ms] {
             char wait[64];
             std::snprintf(wait, sizeof wait, "; finish_step %.1f ms", median(*finish_ms));
             std::string note = std::to_string(red->bucket_count()) + " buckets" + wait;
             if (state) {
               char buf[64];
               std::snprintf(buf, sizeof buf, ", %.0fx fewer elements",
                             state->compression_stats().compression_rate);
               note += buf;
             }
             return note;
           }};
    m.warmup = hook == "powersgd" ? 3 : 1;
    modes.push_back(std::move(m));
  };
  add_reducer("after", "reducer, every gradient marked after the backward", {}, "", 1e-6);
  add_reducer("overlap", "reducer, overlapped (allreduce AVG per bucket)", {}, "", 1e-6);
  add_reducer("view", "reducer, overlapped, gradient_as_bucket_view",
              {.gradient_as_bucket_view = true}, "", 1e-6);
  add_reducer("fp16", "reducer + fp16_compress_hook", {}, "fp16", 1e-3);
  add_reducer("powersgd", "reducer + PowerSGD rank 4", {}, "powersgd", -1);

  // Warm up each, then rounds: every mode once per round, so that the
  // machine's slow seconds fall on all of them alike.
  for (auto& m : modes)
    for (int k = 0; k < m.warmup; ++k) timed(pg, m.step);
  std::vector<bool> correct(modes.size(), true);
  for (int r = 0; r < rounds; ++r) {
    double alone = 0;
    for (std::size_t k = 0; k < modes.size(); ++k) {
      const double t = timed(pg, modes[k].step);
      if (k == 0) alone = t;
      modes[k].times.push_back(t);
      modes[k].exposed.push_back(t - alone);
      correct[k] = correct[k] && modes[k].correct();
    }
  }

  if (rank != 0) return;
  std::printf(
      "\n%d ranks (%s), %zu tensors, %.1f M float32 parameters (%.0f MiB), backward spins "
      "%.0f us/MiB, medians of %d rounds (each round times every row once)\n\n",
      n, launched_here ? "one process per rank" : "threads of one process", grads.size(),
      params / 1e6, params * 4.0 / (1 << 20), o.compute_us_per_mib, rounds);
  double flat_exposed = 0;
  for (auto& m : modes)
    if (m.key == "flat") flat_exposed = median(m.exposed);
  std::printf("| synchronisation | step ms | exposed ms | exposed / flat's | values | notes |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (std::size_t k = 0; k < modes.size(); ++k) {
    const auto& m = modes[k];
    char exposed[32] = "-", ratio[32] = "-";
    if (k > 0) {
      std::snprintf(exposed, sizeof exposed, "%.1f", median(m.exposed));
      if (flat_exposed > 0)
        std::snprintf(ratio, sizeof ratio, "%.2f", median(m.exposed) / flat_exposed);
    }
    std::printf("| %s | %.1f | %s | %s | %s | %s |\n", m.label.c_str(), median(m.times), exposed,
                ratio, correct[k] ? "ok" : "WRONG", m.note().c_str());
  }
  std::fflush(stdout);
  for (bool c : correct)
    if (!c) throw std::runtime_error("some synchronisation produced wrong gradients");
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

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto o = parse(argc, argv);
    troupe::run_job(o.ranks, [&](troupe::world& w, bool launched) { run(w, o, launched); },
                    {.timeout = std::chrono::seconds(300)});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reducer_bench FAILED: %s\n", e.what());
    return 1;
  }
  return 0;
}
