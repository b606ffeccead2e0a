// gpu_bench — troupe on one GPU, in one run: allreduce bandwidth by size, the
// overhead of a tiny allreduce, the reduction kernel against a copy, and two
// ranks sharing the GPU. One table per part, then the targets (met / MISSED /
// not measured, with the numbers).
//
//   gpu_bench [--quick] [--iters N] [--csv PATH] [--torch-us X]
//
// bench/run_gpu_bench.sh builds and runs it (and bench/torch_nccl_bench.py,
// whose median it passes as --torch-us, when PyTorch sees a GPU).
//
// Everything runs on cuda:0, float32 unless named. Times are medians: of the
// timed iterations that follow the warm-up (at least 20 by default; --iters N
// sets every measurement's count).
//
//   1 allreduce   bus bandwidth by size (4 B, 1 KiB, 64 KiB, 1 MiB, 16 MiB,
//                 64 MiB, 256 MiB; --quick stops at 16 MiB) of troupe's
//                 "nccl" backend on a one-rank group and of its "actor"
//                 backend with 2 and 4 ranks of this process sharing cuda:0
//                 (troupe::testing::run_ranks). Every rank first checks one
//                 allreduce against the expected sums (bench_common's pattern,
//                 copied in from and out to host tensors), then times
//                 pg.allreduce(t).wait() in place with the host clock; a
//                 size's time is the largest of the ranks' medians. busbw as
//                 nccl-tests: bytes / time x 2(n-1)/n; for n = 1 algbw (bytes
//                 / time).
//   2 overhead    a 4-byte allreduce (one element, one rank) through troupe's
//                 nccl backend (pg.allreduce(t).wait()) against a raw
//                 ncclAllReduce + cudaStreamSynchronize on a one-rank
//                 communicator of this program (ncclCommInitAll), both timed
//                 with the host clock around each call, and against PyTorch's
//                 ProcessGroupNCCL (all_reduce + torch.cuda.synchronize(),
//                 --torch-us). Prints troupe - raw.
//   3 kernels     troupe's reduction kernel (gpu::reduce: float32 SUM of 2
//                 sources into 1 destination) against cudaMemcpyAsync device
//                 to device of the same size, at 1, 16, 64 and 256 MiB, and
//                 float16 and bfloat16 at 256 MiB. Each call is timed with CUDA
//                 events; the calls of a batch queue up behind a host function
//                 that holds the stream until all are issued, so the events
//                 time the GPU, not the launches. Up to 64 MiB the calls
//                 rotate among buffers that together hold at least 4 x the L2
//                 cache, so the cache is not what is measured. GB/s counts the
//                 bytes read and written: reduce 3 x size, copy 2 x size. The
//                 kernel's result is checked once per size before timing.
//   4 sharing     2 ranks sharing cuda:0 ("actor"), allreduce of 256 MiB (part
//                 1's number when it ran, else measured here) against part 3's
//                 copy at 256 MiB. The allreduce reads and writes 4 x size bytes
//                 in all (each rank reduces its half: it reads that half from
//                 both inputs and writes it into both outputs), the copy 2 x
//                 size.
//
// --quick shortens part 1 and the iteration counts; parts 3 and 4 take seconds
// and run whole, so every target is measured. --csv PATH writes one row per
// measurement: part,system,ranks,bytes,time_us,busbw_GBps,note. Every CUDA and
// NCCL result is checked: a failure prints the call and CUDA's / NCCL's words
// and exits 1. Without a usable CUDA device it prints why (troupe::cuda_status())
// and exits 0.

#include <cuda_runtime.h>
#ifdef TROUPE_HAVE_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "cuda/kernels.hpp"
#include "cuda/runtime.hpp"
#include "troupe/device.hpp"
#include "troupe/dtype.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

#ifndef TROUPE_BENCH_VERSION
#define TROUPE_BENCH_VERSION "unknown"
#endif

namespace {

namespace gpu = troupe::detail::gpu;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
constexpr int dev = 0;  // every part runs on cuda:0
constexpr const char* nccl_backend = "cpu:actor,cuda:nccl";

// -- checked CUDA and NCCL calls ------------------------------------------------

void check_cuda(cudaError_t e, const char* call, int line) {
  if (e == cudaSuccess) return;
  std::fflush(stdout);
  std::fprintf(stderr, "gpu_bench: %s failed: %s (%s), gpu_bench.cpp:%d\n", call,
               cudaGetErrorString(e), cudaGetErrorName(e), line);
  std::exit(1);
}
#define CUDA_CHECK(call) check_cuda((call), #call, __LINE__)

#ifdef TROUPE_HAVE_NCCL
void check_nccl(ncclResult_t r, const char* call, int line) {
  if (r == ncclSuccess) return;
  const char* last = ncclGetLastError(nullptr);
  std::fflush(stdout);
  std::fprintf(stderr, "gpu_bench: %s failed: %s (%s), gpu_bench.cpp:%d\n", call,
               ncclGetErrorString(r), last && *last ? last : "no details", line);
  std::exit(1);
}
#define NCCL_CHECK(call) check_nccl((call), #call, __LINE__)
#endif

// -- options, iterations, medians, formatting ------------------------------------

struct options {
  bool quick = false;
  int iters = 0;          ///< 0: the plan's default
  std::string csv;        ///< empty: no CSV
  double torch_us = NAN;  ///< PyTorch's 4-byte allreduce, NaN: not measured
};

const char* const usage = "usage: gpu_bench [--quick] [--iters N] [--csv PATH] [--torch-us X]\n";

options parse_args(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--quick") {
      o.quick = true;
    } else if (a == "--iters") {
      const std::string v = value();
      o.iters = std::atoi(v.c_str());
      if (o.iters < 1) throw std::invalid_argument("--iters " + v + ": expects a count >= 1");
    } else if (a == "--csv") {
      o.csv = value();
    } else if (a == "--torch-us") {
      const std::string v = value();
      char* end = nullptr;
      o.torch_us = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(o.torch_us > 0))
        throw std::invalid_argument("--torch-us " + v + ": expects a time in us > 0");
    } else if (a == "-h" || a == "--help") {
      std::printf("%s", usage);
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown argument '" + a + "'");
    }
  }
  return o;
}

/// Warm-up and timed iterations of one measurement.
struct plan {
  int warmup = 3;
  int iters = 20;
};

/// By size: many iterations where each is short. --iters overrides the count.
plan plan_for(std::size_t bytes, const options& o) {
  plan p = bytes <= MiB ? plan{20, 100} : bytes <= 16 * MiB ? plan{5, 50} : plan{3, 20};
  if (o.quick) p = bytes <= MiB ? plan{10, 50} : plan{2, 20};
  if (o.iters > 0) p.iters = o.iters;
  return p;
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const auto m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

/// Runs `fn` p.warmup times, then p.iters times timed one by one with the
/// host clock; the times in µs.
std::vector<double> time_host(const plan& p, const std::function<void()>& fn) {
  for (int i = 0; i < p.warmup; ++i) fn();
  std::vector<double> us;
  us.reserve(p.iters);
  for (int i = 0; i < p.iters; ++i) {
    const auto t0 = clock_type::now();
    fn();
    us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
  }
  return us;
}

/// GB/s (1e9 bytes) of `bytes` in `us` microseconds.
double gbps(double bytes, double us) {
  return bytes / (us * 1e-6) / 1e9;
}

/// nccl-tests' bus bandwidth of an allreduce: algbw x 2(n-1)/n; algbw for n = 1.
double allreduce_busbw(std::size_t bytes, int n, double us) {
  const double algbw = gbps(double(bytes), us);
  return n == 1 ? algbw : algbw * bench::bus_factor(bench::op_kind::allreduce, n);
}

std::string fmt(const char* f, double v) {
  if (std::isnan(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

/// Bandwidths below 0.01 GB/s in exponent form, as the CPU report prints them.
std::string fmt_bw(double v) {
  return fmt(v < 0.01 ? "%.2e" : "%.3f", v);
}

/// The CSV of the run: one row per measurement, flushed as it is written.
class csv_file {
 public:
  explicit csv_file(const std::string& path) {
    if (path.empty()) return;
    f_ = std::fopen(path.c_str(), "w");
    if (!f_) throw std::runtime_error("--csv " + path + ": cannot open for writing");
    std::fprintf(f_, "part,system,ranks,bytes,time_us,busbw_GBps,note\n");
  }
  ~csv_file() {
    if (f_) std::fclose(f_);
  }
  csv_file(const csv_file&) = delete;
  csv_file& operator=(const csv_file&) = delete;

  /// `note` is quoted (it may hold commas).
  void row(const char* part, const std::string& system, int ranks, std::size_t bytes,
           double time_us, double busbw, const std::string& note) {
    if (!f_) return;
    std::string quoted;
    for (char c : note) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    std::fprintf(f_, "%s,%s,%d,%zu,%.3f,%.6g,\"%s\"\n", part, system.c_str(), ranks, bytes, time_us,
                 busbw, quoted.c_str());
    std::fflush(f_);
  }

 private:
  std::FILE* f_ = nullptr;
};

// -- part 1: allreduce bandwidth by size --------------------------------------------

/// One size of an allreduce measurement and its iterations.
struct size_plan {
  std::size_t bytes = 0;
  plan p;
};

/// Fills this rank's tensor with bench_common's pattern, allreduces it once
/// and compares the result with the expected sums; throws naming the first
/// wrong element.
void check_allreduce(troupe::process_group& pg, troupe::tensor& t, int rank, int n,
                     const bench::layout& l) {
  auto host = troupe::tensor::empty({std::int64_t(l.in_elems)}, troupe::dtype::float32);
  bench::fill_input(bench::op_kind::allreduce, rank, l, host.data_as<float>());
  t.copy_from(host);
  pg.allreduce(t).wait();
  host.copy_from(t);
  std::string first;
  if (auto wrong =
          bench::count_wrong(bench::op_kind::allreduce, rank, n, l, host.data_as<float>(), first))
    throw std::runtime_error("wrong result before timing: " + std::to_string(wrong) +
                             " elements differ; first: " + first);
}

/// An in-place float32 allreduce on cuda:0 by `n` ranks of this process
/// (one thread each) with `backend`, at every size: each rank checks one
/// allreduce, then times its own; per size the largest of the ranks' medians
/// (µs). The ranks share memory, so the program must not run under a launcher.
std::vector<double> time_allreduce(int n, const std::string& backend,
                                   const std::vector<size_plan>& sizes) {
  std::vector<std::vector<double>> medians(n, std::vector<double>(sizes.size(), NAN));
  troupe::testing::run_ranks(
      n,
      [&](troupe::world& w) {
        auto& pg = w.default_group();
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          const auto l = bench::make_layout(bench::op_kind::allreduce, sizes[k].bytes, n);
          auto t = troupe::tensor::empty({std::int64_t(l.in_elems)}, troupe::dtype::float32,
                                         troupe::device::cuda(dev));
          check_allreduce(pg, t, w.rank(), n, l);
          // In place: with n > 1 the values grow every call (to inf, never NaN).
          medians[w.rank()][k] = median(time_host(sizes[k].p, [&] { pg.allreduce(t).wait(); }));
        }
      },
      {.backend = backend, .timeout = std::chrono::minutes(5)});
  std::vector<double> slowest(sizes.size(), 0.0);
  for (const auto& rank : medians)
    for (std::size_t k = 0; k < sizes.size(); ++k) slowest[k] = std::max(slowest[k], rank[k]);
  return slowest;
}

/// One system's column of part 1: the time per size (NaN: not measured).
struct allreduce_column {
  std::string label;   ///< "nccl n=1"
  std::string system;  ///< CSV: troupe-nccl, troupe-actor
  int ranks = 1;
  std::vector<double> us;
};

struct allreduce_table {
  std::vector<std::size_t> sizes;
  std::vector<allreduce_column> columns;

  /// The time of `system` with `ranks` at `bytes`, NaN when not measured.
  double us_of(const std::string& system, int ranks, std::size_t bytes) const {
    for (const auto& c : columns)
      if (c.system == system && c.ranks == ranks)
        for (std::size_t k = 0; k < sizes.size(); ++k)
          if (sizes[k] == bytes) return c.us[k];
    return NAN;
  }
};

/// Part 1: the nccl backend on one rank, the actor backend on 2 and 4 ranks
/// sharing cuda:0; prints both tables (times, bus bandwidth).
allreduce_table part_allreduce(const options& o, csv_file& csv) {
  allreduce_table table;
  table.sizes = {4, KiB, 64 * KiB, MiB, 16 * MiB};
  if (!o.quick) table.sizes.insert(table.sizes.end(), {64 * MiB, 256 * MiB});
  std::vector<size_plan> plans;
  for (auto b : table.sizes) plans.push_back({b, plan_for(b, o)});

#ifdef TROUPE_HAVE_NCCL
  table.columns.push_back({"nccl n=1", "troupe-nccl", 1, time_allreduce(1, nccl_backend, plans)});
#endif
  for (int n : {2, 4})
    table.columns.push_back(
        {"actor n=" + std::to_string(n), "troupe-actor", n, time_allreduce(n, "actor", plans)});

  auto header = [&](const char* title, const char* gap) {
    std::printf("\n%s\n%s%8s |", title, gap, "size");
    for (const auto& c : table.columns) std::printf(" %11s", c.label.c_str());
    std::printf("\n");
  };
  header("### 1. allreduce (float32, in place, cuda:0): time per op (us)", "\n");
  for (std::size_t k = 0; k < table.sizes.size(); ++k) {
    std::printf("%8s |", bench::size_label(table.sizes[k]).c_str());
    for (const auto& c : table.columns) std::printf(" %11s", fmt("%.1f", c.us[k]).c_str());
    std::printf("\n");
  }
  header("allreduce bus bandwidth (GB/s; n = 1: algbw):", "");
  for (std::size_t k = 0; k < table.sizes.size(); ++k) {
    std::printf("%8s |", bench::size_label(table.sizes[k]).c_str());
    for (const auto& c : table.columns) {
      const double bw = allreduce_busbw(table.sizes[k], c.ranks, c.us[k]);
      std::printf(" %11s", fmt_bw(bw).c_str());
      csv.row("1-allreduce", c.system, c.ranks, table.sizes[k], c.us[k], bw,
              c.ranks == 1 ? "busbw = algbw (1 rank)" : "busbw = algbw x 2(n-1)/n");
    }
    std::printf("\n");
  }
  const std::string iters = o.iters > 0 ? std::to_string(o.iters)
                            : o.quick   ? "50 up to 1 MiB, 20 above"
                                        : "100 up to 1 MiB, 50 up to 16 MiB, 20 above";
  std::printf(
      "\ntime: the slowest rank's median over the timed pg.allreduce(t).wait() calls (%s)\n"
      "after warm-up, every rank's result checked once before; nccl n=1: troupe's \"nccl\"\n"
      "backend, one rank; actor n=2, n=4: troupe's \"actor\" backend, ranks of this process\n"
      "sharing cuda:0. busbw as nccl-tests: bytes / time x 2(n-1)/n (n = 1: bytes / time).\n",
      iters.c_str());
#ifndef TROUPE_HAVE_NCCL
  std::printf("troupe was built without NCCL: no nccl column.\n");
#endif
  return table;
}

// -- part 2: overhead of a 4-byte allreduce ------------------------------------------

struct overhead_result {
  double raw_us = NAN;     ///< ncclAllReduce + cudaStreamSynchronize
  double troupe_us = NAN;  ///< troupe's nccl backend, pg.allreduce(t).wait()
  double torch_us = NAN;   ///< torch.distributed ProcessGroupNCCL (--torch-us)
};

#ifdef TROUPE_HAVE_NCCL
/// A raw one-rank NCCL allreduce of one float: ncclAllReduce on one stream,
/// then cudaStreamSynchronize, per iteration; checked once, the median in µs.
double time_raw_nccl(const plan& p) {
  int devices[1] = {dev};
  ncclComm_t comm = nullptr;
  NCCL_CHECK(ncclCommInitAll(&comm, 1, devices));
  CUDA_CHECK(cudaSetDevice(dev));
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float* buf = nullptr;
  CUDA_CHECK(cudaMalloc(&buf, sizeof(float)));
  const float in = 3.5f;
  float out = 0.0f;
  CUDA_CHECK(cudaMemcpy(buf, &in, sizeof in, cudaMemcpyHostToDevice));
  NCCL_CHECK(ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  CUDA_CHECK(cudaMemcpy(&out, buf, sizeof out, cudaMemcpyDeviceToHost));
  if (out != in)
    throw std::runtime_error("raw ncclAllReduce of one rank: got " + std::to_string(out) +
                             ", expected " + std::to_string(in));
  const auto us = time_host(p, [&] {
    NCCL_CHECK(ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
  });
  NCCL_CHECK(ncclCommDestroy(comm));
  CUDA_CHECK(cudaFree(buf));
  CUDA_CHECK(cudaStreamDestroy(s));
  return median(us);
}
#endif

/// Part 2: raw NCCL, troupe's nccl backend and (given) PyTorch at 4 bytes.
overhead_result part_overhead(const options& o, csv_file& csv) {
  overhead_result r;
  r.torch_us = o.torch_us;
  plan p = o.quick ? plan{50, 500} : plan{200, 2000};
  if (o.iters > 0) p.iters = o.iters;
  std::printf("\n### 2. overhead of a 4-byte allreduce (float32, 1 element, 1 rank, cuda:0)\n\n");
#ifdef TROUPE_HAVE_NCCL
  r.raw_us = time_raw_nccl(p);
  r.troupe_us = time_allreduce(1, nccl_backend, {{4, p}})[0];
#endif
  std::printf("%-58s %10s\n", "system", "median us");
  std::printf("%-58s %10s\n", "raw NCCL: ncclAllReduce + cudaStreamSynchronize",
              fmt("%.2f", r.raw_us).c_str());
  std::printf("%-58s %10s\n", "troupe nccl backend: pg.allreduce(t).wait()",
              fmt("%.2f", r.troupe_us).c_str());
  std::printf("%-58s %10s\n", "torch.distributed ProcessGroupNCCL: all_reduce + synchronize",
              std::isnan(r.torch_us) ? "not measured" : fmt("%.2f", r.torch_us).c_str());
  std::printf("\ntroupe - raw: %s us (%d timed iterations each after %d warm-up; host clock)\n",
              fmt("%+.2f", r.troupe_us - r.raw_us).c_str(), p.iters, p.warmup);
#ifndef TROUPE_HAVE_NCCL
  std::printf("troupe was built without NCCL: nothing to measure here.\n");
#endif
  if (std::isnan(r.torch_us))
    std::printf(
        "PyTorch: not measured (bench/run_gpu_bench.sh runs bench/torch_nccl_bench.py\n"
        "when torch.cuda.is_available(); its number arrives as --torch-us).\n");
  auto row = [&](const char* system, double us, const std::string& note) {
    if (!std::isnan(us)) csv.row("2-overhead", system, 1, 4, us, allreduce_busbw(4, 1, us), note);
  };
  row("raw-nccl", r.raw_us, "ncclAllReduce + cudaStreamSynchronize");
  row("troupe-nccl", r.troupe_us,
      "pg.allreduce(t).wait(); troupe - raw = " + fmt("%.2f", r.troupe_us - r.raw_us) + " us");
  row("torch-nccl", r.torch_us, "bench/torch_nccl_bench.py (all_reduce + synchronize)");
  return r;
}

// -- part 3: reduction kernel against a device-to-device copy -------------------------

/// Holds a stream: close() enqueues a host function that spins until open()
/// (or 10 s), so the work issued behind it queues up and then runs back to
/// back. The destructor opens and waits for the stream, so the host function
/// never outlives the gate.
class stream_gate {
 public:
  explicit stream_gate(cudaStream_t s) : s_(s) {}
  ~stream_gate() {
    open();
    (void)cudaStreamSynchronize(s_);
  }
  stream_gate(const stream_gate&) = delete;
  stream_gate& operator=(const stream_gate&) = delete;

  void close() {
    open_.store(false, std::memory_order_release);
    CUDA_CHECK(cudaLaunchHostFunc(s_, &hold, this));
  }
  void open() { open_.store(true, std::memory_order_release); }
  /// Whether a hold gave up waiting (the timing behind it is not back to back).
  bool expired() const { return expired_.load(std::memory_order_acquire); }

 private:
  static void hold(void* self) {  // on CUDA's callback thread; calls no CUDA
    auto* g = static_cast<stream_gate*>(self);
    const auto until = clock_type::now() + std::chrono::seconds(10);
    while (!g->open_.load(std::memory_order_acquire)) {
      if (clock_type::now() > until) {
        g->expired_.store(true, std::memory_order_release);
        return;
      }
      std::this_thread::yield();
    }
  }

  cudaStream_t s_;
  std::atomic<bool> open_{true};
  std::atomic<bool> expired_{false};
};

/// Times `issue(i)` (one operation on `s`) with CUDA events: p.warmup calls
/// (also loading the kernels), then p.iters calls in batches of up to 32
/// queued behind a gate, each between two events; the times in µs.
std::vector<double> time_device(cudaStream_t s, const plan& p,
                                const std::function<void(int)>& issue) {
  int i = 0;
  for (int w = 0; w < std::max(p.warmup, 1); ++w) issue(i++);
  CUDA_CHECK(cudaStreamSynchronize(s));
  constexpr int batch = 32;
  std::vector<cudaEvent_t> ev(batch + 1);
  for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
  std::vector<double> us;
  {
    stream_gate gate(s);
    for (int done = 0; done < p.iters;) {
      const int k = std::min(batch, p.iters - done);
      gate.close();
      CUDA_CHECK(cudaEventRecord(ev[0], s));
      for (int j = 0; j < k; ++j) {
        issue(i++);
        CUDA_CHECK(cudaEventRecord(ev[j + 1], s));
      }
      gate.open();
      CUDA_CHECK(cudaStreamSynchronize(s));
      if (gate.expired())
        throw std::runtime_error("part 3: the stream was held for 10 s: issuing a batch blocked");
      for (int j = 0; j < k; ++j) {
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, ev[j], ev[j + 1]));
        us.push_back(double(ms) * 1e3);
      }
      done += k;
    }
  }
  for (auto& e : ev) CUDA_CHECK(cudaEventDestroy(e));
  return us;
}

/// Device buffers of `bytes` each to rotate through: up to 64 MiB a multiple
/// of 6 of them (3 per reduce, 2 per copy) that together hold at least 4 x the
/// L2 cache, so a buffer is evicted before it is used again; above, 3.
class buffer_pool {
 public:
  buffer_pool(std::size_t bytes, std::size_t l2_bytes) : bytes_(bytes) {
    if (bytes <= 64 * MiB) {
      const std::size_t least = (4 * l2_bytes + bytes - 1) / bytes;
      count_ = std::max<std::size_t>(6, (least + 5) / 6 * 6);
    }
    CUDA_CHECK(cudaMalloc(&base_, count_ * bytes_));
    CUDA_CHECK(cudaMemset(base_, 0, count_ * bytes_));
  }
  ~buffer_pool() { CUDA_CHECK(cudaFree(base_)); }
  buffer_pool(const buffer_pool&) = delete;
  buffer_pool& operator=(const buffer_pool&) = delete;

  void* at(std::size_t i) const { return static_cast<unsigned char*>(base_) + i * bytes_; }
  std::size_t reduce_sets() const { return count_ / 3; }  ///< sources 3k, 3k+1, destination 3k+2
  std::size_t copy_sets() const { return count_ / 2; }    ///< source 2k, destination 2k+1

 private:
  std::size_t bytes_;
  std::size_t count_ = 3;
  void* base_ = nullptr;
};

/// gpu::reduce's arguments: SUM of sources 3k and 3k+1 of `pool` into 3k+2.
gpu::reduce_args sum_of_two(const buffer_pool& pool, std::size_t set, troupe::dtype t,
                            std::size_t count) {
  gpu::reduce_args a;
  a.type = t;
  a.op = troupe::reduce_op::SUM;
  a.count = count;
  a.srcs = {pool.at(3 * set), pool.at(3 * set + 1)};
  a.dsts = {pool.at(3 * set + 2)};
  return a;
}

/// Checks one SUM of the first set: small integers, exact in every dtype.
template <class T>
void check_sum(const buffer_pool& pool, troupe::dtype t, std::size_t count, cudaStream_t s) {
  std::vector<T> a(count), b(count), out(count);
  for (std::size_t i = 0; i < count; ++i) {
    a[i] = T(float(i % 13));
    b[i] = T(float(2 * (i % 7)));
  }
  const std::size_t bytes = count * sizeof(T);
  CUDA_CHECK(cudaMemcpy(pool.at(0), a.data(), bytes, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(pool.at(1), b.data(), bytes, cudaMemcpyHostToDevice));
  gpu::reduce("gpu_bench", dev, sum_of_two(pool, 0, t, count), s);
  CUDA_CHECK(cudaStreamSynchronize(s));
  CUDA_CHECK(cudaMemcpy(out.data(), pool.at(2), bytes, cudaMemcpyDeviceToHost));
  for (std::size_t i = 0; i < count; ++i)
    if (!(out[i] == T(float(i % 13 + 2 * (i % 7)))))
      throw std::runtime_error("part 3: gpu::reduce SUM " + std::string(troupe::to_string(t)) +
                               " of " + bench::size_label(bytes) + ": element " +
                               std::to_string(i) + " is wrong");
}

struct kernel_row {
  troupe::dtype type = troupe::dtype::float32;
  std::size_t bytes = 0;
  double copy_us = NAN, reduce_us = NAN;
  double copy_gbps() const { return gbps(2.0 * double(bytes), copy_us); }
  double reduce_gbps() const { return gbps(3.0 * double(bytes), reduce_us); }
  double ratio() const { return reduce_gbps() / copy_gbps(); }
};

/// One row of part 3: copy, then reduce, of `bytes` of dtype `t`.
kernel_row measure_kernel(troupe::dtype t, std::size_t bytes, std::size_t l2, cudaStream_t s,
                          const options& o) {
  const std::size_t count = bytes / troupe::element_size(t);
  buffer_pool pool(bytes, l2);
  switch (t) {
    case troupe::dtype::float16:
      check_sum<troupe::float16_t>(pool, t, count, s);
      break;
    case troupe::dtype::bfloat16:
      check_sum<troupe::bfloat16_t>(pool, t, count, s);
      break;
    default:
      check_sum<float>(pool, t, count, s);
  }
  const plan p = plan_for(bytes, o);
  kernel_row r{t, bytes};
  r.copy_us = median(time_device(s, p, [&](int i) {
    const std::size_t k = std::size_t(i) % pool.copy_sets();
    CUDA_CHECK(
        cudaMemcpyAsync(pool.at(2 * k + 1), pool.at(2 * k), bytes, cudaMemcpyDeviceToDevice, s));
  }));
  r.reduce_us = median(time_device(s, p, [&](int i) {
    gpu::reduce("gpu_bench", dev, sum_of_two(pool, std::size_t(i) % pool.reduce_sets(), t, count),
                s);
  }));
  return r;
}

/// Part 3: the kernel against the copy by size (float32), then the half types.
std::vector<kernel_row> part_kernels(const options& o, const cudaDeviceProp& prop, csv_file& csv) {
  const std::size_t l2 = std::size_t(std::max(prop.l2CacheSize, 0));
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaSetDevice(dev));
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<kernel_row> rows;
  for (std::size_t b : {MiB, 16 * MiB, 64 * MiB, 256 * MiB})
    rows.push_back(measure_kernel(troupe::dtype::float32, b, l2, s, o));
  for (auto t : {troupe::dtype::float16, troupe::dtype::bfloat16})
    rows.push_back(measure_kernel(t, 256 * MiB, l2, s, o));
  CUDA_CHECK(cudaStreamDestroy(s));

  std::printf(
      "\n### 3. reduction kernel (gpu::reduce, SUM of 2 sources into 1) vs cudaMemcpyAsync D2D\n\n"
      "%-9s %8s | %9s %9s | %10s %10s | %11s\n",
      "dtype", "size", "copy us", "copy GB/s", "reduce us", "reduce GB/s", "kernel/copy");
  for (const auto& r : rows) {
    const std::string dt(troupe::to_string(r.type));
    std::printf("%-9s %8s | %9.1f %9.1f | %10.1f %10.1f | %11.3f\n", dt.c_str(),
                bench::size_label(r.bytes).c_str(), r.copy_us, r.copy_gbps(), r.reduce_us,
                r.reduce_gbps(), r.ratio());
    csv.row("3-kernels", "copy-d2d", 1, r.bytes, r.copy_us, r.copy_gbps(),
            dt + ": GB/s = 2 x bytes (read + written) / time");
    csv.row(
        "3-kernels", "reduce-sum2", 1, r.bytes, r.reduce_us, r.reduce_gbps(),
        dt + ": GB/s = 3 x bytes (read + written) / time; kernel/copy = " + fmt("%.3f", r.ratio()));
  }
  std::printf(
      "\nGB/s counts bytes read + written: reduce 3 x size (2 sources, 1 destination), copy\n"
      "2 x size. Times: CUDA events around each call, median; calls queued back to back;\n"
      "up to 64 MiB rotating among buffers of at least 4 x L2 (%zu MiB) in all.\n",
      l2 / MiB);
  return rows;
}

// -- part 4: two ranks sharing the GPU against the copy -------------------------------

struct sharing_result {
  double allreduce_us = NAN, copy_us = NAN;
  double kernels_us = NAN;  ///< the plan's two kernels alone, back to back
  double allreduce_gbps() const { return gbps(4.0 * double(256 * MiB), allreduce_us); }
  double copy_gbps() const { return gbps(2.0 * double(256 * MiB), copy_us); }
  double ratio() const { return allreduce_gbps() / copy_gbps(); }
};

/// Part 4: part 1's 2-rank 256 MiB allreduce (measured here under --quick)
/// against part 3's float32 copy of 256 MiB.
sharing_result part_sharing(const options& o, const allreduce_table& t,
                            const std::vector<kernel_row>& kernels, csv_file& csv) {
  constexpr std::size_t bytes = 256 * MiB;
  sharing_result r;
  r.allreduce_us = t.us_of("troupe-actor", 2, bytes);
  if (std::isnan(r.allreduce_us))
    r.allreduce_us = time_allreduce(2, "actor", {{bytes, plan_for(bytes, o)}})[0];
  for (const auto& k : kernels)
    if (k.type == troupe::dtype::float32 && k.bytes == bytes) r.copy_us = k.copy_us;
  {
    // The floor of the allreduce: the kernels the direct plan runs, alone.
    // Rank r sums half r of both tensors into half r of both (in place).
    cudaStream_t s = nullptr;
    CUDA_CHECK(cudaSetDevice(dev));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void* a = nullptr;
    void* b = nullptr;
    CUDA_CHECK(cudaMalloc(&a, bytes));
    CUDA_CHECK(cudaMalloc(&b, bytes));
    CUDA_CHECK(cudaMemset(a, 0x3c, bytes));  // small floats, not zeros
    CUDA_CHECK(cudaMemset(b, 0x3b, bytes));
    const std::size_t half = bytes / 2;
    r.kernels_us = median(time_device(s, plan_for(bytes, o), [&](int) {
      for (std::size_t k = 0; k < 2; ++k) {
        gpu::reduce_args x;
        x.type = troupe::dtype::float32;
        x.op = troupe::reduce_op::SUM;
        x.count = half / sizeof(float);
        auto* ha = static_cast<unsigned char*>(a) + k * half;
        auto* hb = static_cast<unsigned char*>(b) + k * half;
        x.srcs = {ha, hb};
        x.dsts = {ha, hb};
        gpu::reduce("gpu_bench", dev, x, s);
      }
    }));
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b));
    CUDA_CHECK(cudaStreamDestroy(s));
  }
  std::printf(
      "\n### 4. 2 ranks sharing cuda:0 (actor): allreduce 256 MiB vs device-to-device copy\n\n"
      "counting: an allreduce of S bytes by 2 ranks on one GPU reads and writes 4 x S bytes in\n"
      "all (each rank reduces its half: reads it from both inputs, S, and writes it into both\n"
      "outputs, S); a copy of S bytes reads and writes 2 x S.\n\n");
  std::printf("allreduce 256 MiB, 2 ranks: %10.1f us -> 4 x S / time = %7.1f GB/s\n",
              r.allreduce_us, r.allreduce_gbps());
  std::printf("copy 256 MiB (part 3):      %10.1f us -> 2 x S / time = %7.1f GB/s\n", r.copy_us,
              r.copy_gbps());
  std::printf("allreduce / copy:           %10.3f\n", r.ratio());
  std::printf(
      "the plan's kernels alone:   %10.1f us (both ranks' sums, back to back on one\n"
      "                            stream: what is left of the allreduce is orchestration)\n",
      r.kernels_us);
  csv.row("4-sharing", "troupe-actor", 2, bytes, r.allreduce_us, r.allreduce_gbps(),
          "GB/s = 4 x bytes (read + written by both ranks) / time; allreduce/copy = " +
              fmt("%.3f", r.ratio()));
  csv.row("4-sharing", "plan-kernels", 2, bytes, r.kernels_us,
          gbps(4.0 * double(bytes), r.kernels_us),
          "the direct plan's two reductions alone, back to back on one stream");
  return r;
}

// -- targets ------------------------------------------------------------------------

void print_targets(const overhead_result& ov, const std::vector<kernel_row>& kernels,
                   const sharing_result& sh) {
  struct row {
    std::string what, measured, goal, status;
  };
  const std::string na = "not measured";
  auto status = [&](bool measured, bool met) {
    return measured ? std::string(met ? "met" : "MISSED") : na;
  };
  std::vector<row> rows;

  const double over = ov.troupe_us - ov.raw_us;
  rows.push_back({"nccl 4 B allreduce: troupe - raw NCCL",
                  std::isnan(over) ? na
                                   : fmt("%+.2f us", over) + " (" + fmt("%.2f", ov.troupe_us) +
                                         " - " + fmt("%.2f", ov.raw_us) + ")",
                  "<= 10 us", status(!std::isnan(over), over <= 10.0)});
  const bool torch = !std::isnan(ov.torch_us) && !std::isnan(ov.troupe_us);
  rows.push_back({"nccl 4 B allreduce: troupe vs PyTorch",
                  torch ? fmt("%.2f us", ov.troupe_us) + " vs " + fmt("%.2f us", ov.torch_us) : na,
                  "< PyTorch", status(torch, ov.troupe_us < ov.torch_us)});
  const kernel_row* k256 = nullptr;
  for (const auto& k : kernels)
    if (k.type == troupe::dtype::float32 && k.bytes == 256 * MiB) k256 = &k;
  rows.push_back({"reduce kernel / copy GB/s, float32 256 MiB",
                  k256 ? fmt("%.3f", k256->ratio()) + " (" + fmt("%.0f", k256->reduce_gbps()) +
                             " / " + fmt("%.0f", k256->copy_gbps()) + " GB/s)"
                       : na,
                  ">= 0.85", status(k256 != nullptr, k256 && k256->ratio() >= 0.85)});
  const bool shared = !std::isnan(sh.ratio());
  rows.push_back({"2 ranks on 1 GPU: allreduce 256 MiB / copy",
                  shared ? fmt("%.3f", sh.ratio()) + " (" + fmt("%.0f", sh.allreduce_gbps()) +
                               " / " + fmt("%.0f", sh.copy_gbps()) + " GB/s)"
                         : na,
                  ">= 0.70", status(shared, sh.ratio() >= 0.70)});

  int met = 0, missed = 0, unmeasured = 0;
  std::printf("\n### targets (troupe on the GPU, from this run)\n\n%-44s %-30s %-10s %s\n",
              "target", "measured", "goal", "status");
  for (const auto& t : rows) {
    std::printf("%-44s %-30s %-10s %s\n", t.what.c_str(), t.measured.c_str(), t.goal.c_str(),
                t.status.c_str());
    met += t.status == "met";
    missed += t.status == "MISSED";
    unmeasured += t.status == na;
  }
  std::printf(
      "\n%d met, %d missed, %d not measured. Overhead: medians of part 2 (host clock around\n"
      "each call). Kernel: GB/s read + written, reduce 3 x size, copy 2 x size (part 3).\n"
      "Sharing: 4 x size read + written per allreduce over the copy's 2 x size (part 4).\n",
      met, missed, unmeasured);
}

// -- the run ------------------------------------------------------------------------

void print_versions() {
  int runtime = 0;
  CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf("gpu_bench: troupe %s, CUDA runtime %d.%d", TROUPE_BENCH_VERSION, runtime / 1000,
              runtime % 1000 / 10);
#ifdef TROUPE_HAVE_NCCL
  int v = 0;
  NCCL_CHECK(ncclGetVersion(&v));
  std::printf(", NCCL %d.%d.%d (headers %d.%d.%d)", v / 10000, v % 10000 / 100, v % 100, NCCL_MAJOR,
              NCCL_MINOR, NCCL_PATCH);
#else
  std::printf(", NCCL: not built");
#endif
  std::printf("\n");
}

cudaDeviceProp print_device() {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  int driver = 0;
  CUDA_CHECK(cudaDriverGetVersion(&driver));
  std::printf("gpu_bench: cuda:%d %s (sm_%d%d, %d SMs, %.0f GiB, L2 %d MiB), driver %d.%d\n", dev,
              prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              double(prop.totalGlobalMem) / double(1024 * MiB), prop.l2CacheSize / int(MiB),
              driver / 1000, driver % 1000 / 10);
  return prop;
}

int run(const options& o) {
  print_versions();
  if (!troupe::cuda_available()) {
    std::printf("gpu_bench: GPU benchmark skipped: no CUDA device is usable (%s)\n",
                troupe::cuda_status().c_str());
    return 0;
  }
  if (std::getenv("RANK") || std::getenv("OMPI_COMM_WORLD_RANK") || std::getenv("SLURM_PROCID"))
    throw std::runtime_error(
        "started by a launcher (RANK is set): gpu_bench runs all its ranks in this process");
  const cudaDeviceProp prop = print_device();
  csv_file csv(o.csv);
  const auto start = clock_type::now();

  const allreduce_table table = part_allreduce(o, csv);
  const overhead_result ov = part_overhead(o, csv);
  const std::vector<kernel_row> kernels = part_kernels(o, prop, csv);
  const sharing_result sh = part_sharing(o, table, kernels, csv);
  print_targets(ov, kernels, sh);

  std::printf("\ngpu_bench: %.0f s in all%s%s\n",
              std::chrono::duration<double>(clock_type::now() - start).count(),
              o.csv.empty() ? "" : "; results in ", o.csv.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "gpu_bench: %s\n%s", e.what(), usage);
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "gpu_bench: error: %s\n", e.what());
    return 1;
  }
}
