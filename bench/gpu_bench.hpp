#pragma once
// gpu_bench's parts share (gpu_bench.cpp: the program, parts 1, 2 and 4;
// gpu_bench_kernels.cpp: part 3): checked CUDA calls, the options, the
// iterations of a measurement, medians, formatting, the CSV file, and
// part 3's rows, which the targets read.

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/kernels.hpp"
#include "troupe/dtype.hpp"

namespace gpu_bench {

namespace gpu = troupe::detail::gpu;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
constexpr int dev = 0;  // every part runs on cuda:0

/// Exits 1 naming `call` and CUDA's words unless `e` is cudaSuccess.
void check_cuda(cudaError_t e, const char* call, int line);
#define CUDA_CHECK(call) ::gpu_bench::check_cuda((call), #call, __LINE__)

struct options {
  bool quick = false;
  int iters = 0;          ///< 0: the plan's default
  std::string csv;        ///< empty: no CSV
  double torch_us = NAN;  ///< PyTorch's 4-byte allreduce, NaN: not measured
};

/// Warm-up and timed iterations of one measurement.
struct plan {
  int warmup = 3;
  int iters = 20;
};

/// By size: many iterations where each is short. --iters overrides the count.
plan plan_for(std::size_t bytes, const options& o);
double median(std::vector<double> v);
std::string fmt(const char* f, double v);
/// Bandwidths below 0.01 GB/s in exponent form, as the CPU report prints them.
std::string fmt_bw(double v);

/// GB/s (1e9 bytes) of `bytes` in `us` microseconds.
inline double gbps(double bytes, double us) {
  return bytes / (us * 1e-6) / 1e9;
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

/// Times `issue(i)` (one operation on `s`) with CUDA events: p.warmup calls
/// (also loading the kernels), then p.iters calls in batches of up to 32
/// queued behind a gate, each between two events; the times in µs.
std::vector<double> time_device(cudaStream_t s, const plan& p,
                                const std::function<void(int)>& issue);

/// Part 3's rows: the reduction kernel against a device-to-device copy.
struct kernel_row {
  troupe::dtype type = troupe::dtype::float32;
  std::size_t bytes = 0;
  double copy_us = NAN, reduce_us = NAN;
  double copy_gbps() const { return gbps(2.0 * double(bytes), copy_us); }
  double reduce_gbps() const { return gbps(3.0 * double(bytes), reduce_us); }
  double ratio() const { return reduce_gbps() / copy_gbps(); }
};

/// Part 3: the kernel against the copy by size (float32), then the half types.
std::vector<kernel_row> part_kernels(const options& o, const cudaDeviceProp& prop, csv_file& csv);

}  // namespace gpu_bench
