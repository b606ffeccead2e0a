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
#include "gpu_bench.hpp"
#include "troupe/device.hpp"
#include "troupe/dtype.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

#ifndef TROUPE_BENCH_VERSION
#define TROUPE_BENCH_VERSION "unknown"
#endif

namespace gpu_bench {

constexpr const char* nccl_backend = "cpu:actor,cuda:nccl";

// -- checked CUDA and NCCL calls ------------------------------------------------

void check_cuda(cudaError_t e, const char* call, int line) {
  if (e == cudaSuccess) return;
  std::fflush(stdout);
  std::fprintf(stderr, "gpu_bench: %s failed: %s (%s), gpu_bench.cpp:%d\n", call,
               cudaGetErrorString(e), cudaGetErrorName(e), line);
  std::exit(1);
}

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

}  // namespace gpu_bench

using namespace gpu_bench;

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
