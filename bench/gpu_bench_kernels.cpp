// gpu_bench's part 3 (gpu_bench.cpp says what it measures): troupe's
// reduction kernel against a device-to-device copy.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include "bench_common.hpp"
#include "cuda/runtime.hpp"
#include "gpu_bench.hpp"
#include "troupe/device.hpp"

namespace gpu_bench {

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace gpu_bench
