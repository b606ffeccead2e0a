// troupe's CUDA kernels (cuda/kernels.cu) against the CPU kernels on the same
// inputs: every supported (op, dtype) pair with 1 to 17 sources (across the
// fold of 8 sources per launch), counts from 0 to 100003, aligned, misaligned
// and mixed buffers, in place with several destinations, scales and divisor;
// then scale and divide, casts, copy_segments, invalid arguments and launch
// errors. Inputs are drawn fresh for every run and outputs are poisoned with
// 0xFF bytes before it, so that unwritten elements show. Without a CUDA
// device gpu_main.cpp exits with 77 (skipped) before any case runs.

#include <doctest/doctest.h>

#ifdef TROUPE_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../cuda/kernels.hpp"
#include "../cuda/runtime.hpp"
#include "../kernels/reduce_kernels.hpp"
#include "check_error.hpp"
#include "troupe/dtype.hpp"
#include "troupe/error.hpp"
#include "troupe/reduce_op.hpp"

using namespace troupe;
namespace gpu = troupe::detail::gpu;
using kind = reduce_op::kind;
using bytes_t = std::vector<unsigned char>;
using troupe::test::check_error;

#define CUDA_REQUIRE(call)                                                       \
  do {                                                                           \
    const cudaError_t e_ = (call);                                               \
    REQUIRE_MESSAGE(e_ == cudaSuccess, #call << ": " << cudaGetErrorString(e_)); \
  } while (0)

namespace {

constexpr const char* op_name = "test_op";
constexpr int dev = 0;  // the CUDA device
constexpr std::size_t max_count = 100003;
const std::size_t counts[] = {0, 1, 7, 1000, max_count};
const std::size_t source_counts[] = {1, 2, 3, 8, 9, 17};
const kind kernel_ops[] = {reduce_op::SUM,  reduce_op::PRODUCT, reduce_op::MIN, reduce_op::MAX,
                           reduce_op::BAND, reduce_op::BOR,     reduce_op::BXOR};

std::vector<dtype> all_dtypes() {
  std::vector<dtype> v;
  for (int i = 0; i < dtype_count; ++i) v.push_back(static_cast<dtype>(i));
  return v;
}

bool is_exact(dtype t) {
  return !is_floating_point(t) && !is_complex(t);
}

// The relative error allowed between the GPU's and the CPU's result. Each side
// rounds a 16-bit result `roundings` times in sequence (each scaled source, the
// combination, the division), each rounding off by at most the unit roundoff
// u (2^-8 for bfloat16, 2^-11 for float16); a product compounds them, so one
// element of a 3-source PREMUL_SUM/AVG product in bfloat16 can differ by more
// than 1 % without either side being wrong.
double tolerance(dtype t, int roundings = 1) {
  if (t == dtype::float16 || t == dtype::bfloat16) {
    const double u = t == dtype::bfloat16 ? 0x1p-8 : 0x1p-11;
    return std::max(1e-2, 2.0 * roundings * u);
  }
  if (t == dtype::float32 || t == dtype::complex64) return 1e-6;
  return 1e-12;
}

// splitmix64: fast enough for millions of values per case.
struct rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  // A value of magnitude in [0.5, 1.5) with a random sign: never zero.
  double value() { return (0.5 + uniform()) * ((next() & 1) ? -1.0 : 1.0); }
};

std::uint64_t fresh_seed() {
  return (std::uint64_t(std::random_device{}()) << 32) | std::random_device{}();
}

// A stream on device 0 and device memory, released at the end of a case.
struct gpu_env {
  cudaStream_t stream{};
  std::vector<void*> allocations;
  gpu_env() {
    CUDA_REQUIRE(cudaSetDevice(dev));
    CUDA_REQUIRE(cudaStreamCreate(&stream));
  }
  ~gpu_env() {
    for (void* p : allocations) cudaFree(p);
    cudaStreamDestroy(stream);
  }
  gpu_env(const gpu_env&) = delete;
  gpu_env& operator=(const gpu_env&) = delete;
  gpu::stream_t s() const { return stream; }
  unsigned char* alloc(std::size_t bytes) {
    void* p = nullptr;
    CUDA_REQUIRE(cudaMalloc(&p, bytes));
    allocations.push_back(p);
    return static_cast<unsigned char*>(p);
  }
  void upload(void* d, const void* h, std::size_t n) {
    if (n) CUDA_REQUIRE(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
  }
  bytes_t download(const void* d, std::size_t n) {
    bytes_t h(n);
    if (n) CUDA_REQUIRE(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
    return h;
  }
  void poison(void* d, std::size_t n) { CUDA_REQUIRE(cudaMemset(d, 0xFF, n)); }
  void sync() {
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    CUDA_REQUIRE(cudaGetLastError());
  }
};

// Device memory in slots of room for max_count 16-byte elements, 256-byte aligned.
struct arena {
  static constexpr std::size_t slot_bytes = (max_count + 2) * 16 + 256;
  static constexpr std::size_t nslots = 44;
  unsigned char* base;
  explicit arena(gpu_env& env) : base(env.alloc(slot_bytes * nslots)) {}
  unsigned char* slot(std::size_t k) const { return base + k * slot_bytes; }
};

/// What every kernel test starts from: a fresh seed (reported), a device and
/// an arena of buffers on it.
struct kernel_test {
  const std::uint64_t seed = fresh_seed();
  rng r{seed};
  gpu_env env;
  arena a{env};
};

// Random elements of dtype t (odd integers for PRODUCT, so that products do not vanish).
bytes_t random_elements(dtype t, std::size_t n, rng& r, kind op = reduce_op::SUM) {
  const std::size_t es = element_size(t);
  bytes_t out(n * es);
  unsigned char* p = out.data();
  for (std::size_t i = 0; i < n; ++i, p += es) {
    switch (t) {
      case dtype::bool_: {
        static constexpr unsigned char values[] = {0, 1, 2, 0x7f};  // false and trues
        *p = values[r.next() & 3];
        break;
      }
      case dtype::uint8:
      case dtype::int8:
      case dtype::int16:
      case dtype::int32:
      case dtype::int64: {
        const std::uint64_t mask = es == 8 ? ~0ull : (1ull << (8 * es)) - 1;
        std::uint64_t x = 0;
        while ((x & mask) == 0) x = r.next() | (op == reduce_op::PRODUCT ? 1 : 0);
        std::memcpy(p, &x, es);  // little-endian: the low bytes
        break;
      }
      case dtype::float16: {
        const float16_t h(float(r.value()));
        std::memcpy(p, &h.bits, 2);
        break;
      }
      case dtype::bfloat16: {
        const bfloat16_t h(float(r.value()));
        std::memcpy(p, &h.bits, 2);
        break;
      }
      case dtype::float32:
      case dtype::complex64: {
        const float v[2] = {float(r.value()), float(r.value())};
        std::memcpy(p, v, es);
        break;
      }
      case dtype::float64:
      case dtype::complex128: {
        const double v[2] = {r.value(), r.value()};
        std::memcpy(p, v, es);
        break;
      }
    }
  }
  return out;
}

// Real parts per element (2 for complex) and part k of an element array as a double.
std::size_t parts(dtype t) {
  return is_complex(t) ? 2 : 1;
}
double part(dtype t, const unsigned char* p, std::size_t k) {
  switch (t) {
    case dtype::float16: {
      float16_t h;
      std::memcpy(&h.bits, p + 2 * k, 2);
      return float(h);
    }
    case dtype::bfloat16: {
      bfloat16_t h;
      std::memcpy(&h.bits, p + 2 * k, 2);
      return float(h);
    }
    case dtype::float32:
    case dtype::complex64: {
      float f;
      std::memcpy(&f, p + 4 * k, 4);
      return f;
    }
    default: {
      double d;
      std::memcpy(&d, p + 8 * k, 8);
      return d;
    }
  }
}

// "" when `got` matches `ref` (count elements): integers and bool exactly,
// floating and complex by ||got - ref|| < tol * max(||ref||, ||mag||) with
// `mag` (if given) the magnitudes a sum cancelled. NaN or Inf never passes.
std::string compare(dtype t, const bytes_t& got, const bytes_t& ref, std::size_t count,
                    int roundings, const std::vector<double>* mag = nullptr) {
  const std::size_t es = element_size(t);
  if (is_exact(t)) {
    for (std::size_t i = 0; i < count; ++i)
      if (std::memcmp(got.data() + i * es, ref.data() + i * es, es) != 0) {
        std::ostringstream os;
        os << "element " << i << " differs (first byte " << int(got[i * es]) << ", expected "
           << int(ref[i * es]) << ")";
        return os.str();
      }
    return "";
  }
  double err2 = 0, norm2 = 0, mag2 = 0;
  for (std::size_t k = 0; k < count * parts(t); ++k) {
    const double g = part(t, got.data(), k), e = part(t, ref.data(), k);
    if (!std::isfinite(g) || !std::isfinite(e)) {
      std::ostringstream os;
      os << "part " << k << " is not finite: got " << g << ", expected " << e;
      return os.str();
    }
    err2 += (g - e) * (g - e);
    norm2 += e * e;
    if (mag) mag2 += (*mag)[k] * (*mag)[k];
  }
  const double denom = std::sqrt(std::max(norm2, mag2));
  const double rel = denom > 0 ? std::sqrt(err2) / denom : (err2 > 0 ? INFINITY : 0.0);
  if (rel < tolerance(t, roundings)) return "";
  std::ostringstream os;
  os << "relative error " << rel << " >= " << tolerance(t, roundings);
  return os.str();
}

// The guard element after `count` elements must still be poison.
bool guard_intact(const bytes_t& got, std::size_t from) {
  return std::all_of(got.begin() + std::ptrdiff_t(from), got.end(),
                     [](unsigned char b) { return b == 0xFF; });
}

// One reduction: dsts[k] is source dst_map[k] (in place) or a buffer of its
// own (-1). align 0: every pointer 256-byte aligned; 1: every pointer one
// element past (8 bytes for complex128); 2: mixed, so no common alignment.
struct reduce_case {
  dtype t = dtype::float32;
  kind op = reduce_op::SUM;
  std::size_t nsrc = 1, count = 0;
  int align = 0;
  std::vector<int> dst_map = {-1};
  std::vector<double> scales;
  double divisor = 0;

  std::string describe() const {
    std::ostringstream os;
    os << to_string(op) << " " << to_string(t) << " nsrc=" << nsrc << " count=" << count
       << " align=" << align << " dsts=[";
    for (int k : dst_map) os << k << " ";
    os << "] scales=" << scales.size() << " divisor=" << divisor;
    return os.str();
  }
};

// Runs `c` on the GPU and checks every destination against the CPU kernels
// (scale_by per source, reduce_many, divide_by) and every other source unchanged.
void run_reduce(gpu_env& env, const arena& a, const reduce_case& c, rng& r) {
  INFO(c.describe());
  const std::size_t es = element_size(c.t), bytes = c.count * es;
  const std::size_t shift = std::min<std::size_t>(es, 8);
  const auto shifted = [&](bool odd) { return c.align == 1 || (c.align == 2 && odd); };
  std::vector<unsigned char*> srcs, dsts;
  for (std::size_t j = 0; j < c.nsrc; ++j) srcs.push_back(a.slot(j) + (shifted(j % 2) ? shift : 0));
  for (std::size_t k = 0; k < c.dst_map.size(); ++k)
    dsts.push_back(c.dst_map[k] >= 0 ? srcs[std::size_t(c.dst_map[k])]
                                     : a.slot(20 + k) + (shifted(k % 2 == 0) ? shift : 0));
  REQUIRE(20 + c.dst_map.size() <= arena::nslots);

  // Inputs, poisoned buffers, the reference.
  std::vector<bytes_t> inputs;
  for (std::size_t j = 0; j < c.nsrc; ++j) inputs.push_back(random_elements(c.t, c.count, r, c.op));
  for (std::size_t j = 0; j < c.nsrc; ++j) env.poison(a.slot(j), bytes + 2 * es + 16);
  for (std::size_t k = 0; k < dsts.size(); ++k) env.poison(a.slot(20 + k), bytes + 2 * es + 16);
  for (std::size_t j = 0; j < c.nsrc; ++j) env.upload(srcs[j], inputs[j].data(), bytes);

  bytes_t ref(bytes);
  std::vector<double> mag;
  {
    std::vector<bytes_t> scaled = inputs;
    if (!c.scales.empty())
      for (std::size_t j = 0; j < c.nsrc; ++j)
        detail::scale_by(c.t, scaled[j].data(), c.count, c.scales[j]);
    std::vector<const void*> ptrs;
    for (auto& s : scaled) ptrs.push_back(s.data());
    if (c.count) detail::reduce_many(c.t, c.op, ref.data(), ptrs.data(), c.nsrc, c.count);
    if (c.divisor != 0) detail::divide_by(c.t, ref.data(), c.count, c.divisor);
    if (!is_exact(c.t) && c.op == reduce_op::SUM) {
      mag.assign(c.count * parts(c.t), 0.0);
      for (std::size_t j = 0; j < c.nsrc; ++j)
        for (std::size_t k = 0; k < mag.size(); ++k)
          mag[k] += std::abs(part(c.t, inputs[j].data(), k)) *
                    (c.scales.empty() ? 1.0 : std::abs(c.scales[j])) /
                    (c.divisor != 0 ? std::abs(c.divisor) : 1.0);
    }
  }

  gpu::reduce_args args;
  args.type = c.t;
  args.op = c.op;
  args.count = c.count;
  args.srcs.assign(srcs.begin(), srcs.end());
  args.dsts.assign(dsts.begin(), dsts.end());
  args.scales = c.scales;
  args.divisor = c.divisor;
  gpu::reduce(op_name, dev, args, env.s());
  env.sync();

  for (std::size_t k = 0; k < dsts.size(); ++k) {
    const bytes_t got = env.download(dsts[k], bytes + es);
    const int roundings = (c.scales.empty() ? 0 : int(c.nsrc)) + 1 + (c.divisor != 0 ? 1 : 0);
    const std::string why =
        compare(c.t, got, ref, c.count, roundings, mag.empty() ? nullptr : &mag);
    CHECK_MESSAGE(why.empty(), "destination " << k << ": " << why);
    // Without scales and divisor the GPU combines in the CPU's order and
    // rounds once (float16/bfloat16 too): the results are bit-identical.
    if (c.scales.empty() && c.divisor == 0 && why.empty())
      CHECK_MESSAGE(std::equal(ref.begin(), ref.end(), got.begin()),
                    "destination " << k << " is not bit-identical to the CPU kernels");
    CHECK_MESSAGE(guard_intact(got, bytes), "destination " << k << " written past its end");
  }
  for (std::size_t j = 0; j < c.nsrc; ++j) {
    if (std::find(c.dst_map.begin(), c.dst_map.end(), int(j)) != c.dst_map.end()) continue;
    const bytes_t got = env.download(srcs[j], bytes + es);
    CHECK_MESSAGE(std::equal(inputs[j].begin(), inputs[j].end(), got.begin()),
                  "source " << j << " changed");
    CHECK_MESSAGE(guard_intact(got, bytes), "source " << j << " written past its end");
  }
}

std::vector<int> separate(std::size_t ndst) {
  return std::vector<int>(ndst, -1);
}

std::vector<double> random_scales(std::size_t n, rng& r) {
  std::vector<double> v;
  for (std::size_t j = 0; j < n; ++j) v.push_back(0.25 + 1.75 * r.uniform());
  return v;
}

// float16_t / bfloat16_t from bits, and their float values.
float half_value(dtype t, std::uint16_t bits) {
  if (t == dtype::float16) {
    float16_t h;
    h.bits = bits;
    return float(h);
  }
  bfloat16_t h;
  h.bits = bits;
  return float(h);
}
std::uint16_t half_bits(dtype t, float f) {
  return t == dtype::float16 ? float16_t(f).bits : bfloat16_t(f).bits;
}
bool half_is_nan(dtype t, std::uint16_t bits) {
  return t == dtype::float16 ? (bits & 0x7c00) == 0x7c00 && (bits & 0x3ff)
                             : (bits & 0x7f80) == 0x7f80 && (bits & 0x7f);
}

}  // namespace

TEST_CASE_FIXTURE(
    kernel_test, "reduce matches the CPU kernels for every op, dtype, source count and alignment") {
  INFO("seed " << seed);
  for (dtype t : all_dtypes())
    for (kind op : kernel_ops) {
      if (!is_reduce_supported(op, t)) continue;
      for (std::size_t nsrc : source_counts)
        for (std::size_t count : counts)
          for (int align : {0, 1, 2}) {
            reduce_case c;
            c.t = t;
            c.op = op;
            c.nsrc = nsrc;
            c.count = count;
            c.align = align;
            c.dst_map = separate(1 + (nsrc + count) % 3);  // 1 to 3 destinations
            run_reduce(env, a, c, r);
          }
    }
}

TEST_CASE_FIXTURE(
    kernel_test,
    "reduce in place: destinations are sources, in any order, and more than a launch takes") {
  INFO("seed " << seed);
  for (dtype t : all_dtypes())
    for (kind op : {reduce_op::SUM, reduce_op::MAX, reduce_op::BXOR}) {
      if (!is_reduce_supported(op, t)) continue;
      for (std::size_t nsrc : {1, 2, 3, 8, 9, 17})
        for (std::size_t count : {7, 10007})
          for (int align : {0, 1, 2}) {
            std::vector<std::vector<int>> maps;
            std::vector<int> same(nsrc);
            std::iota(same.begin(), same.end(), 0);
            maps.push_back(same);  // an in-place allreduce of nsrc tensors
            std::vector<int> reversed(same.rbegin(), same.rend());
            maps.push_back(reversed);         // the first destination is the last source
            maps.push_back({int(nsrc) - 1});  // one destination, the last source
            std::vector<int> more = same;
            for (int k = 0; k < 4; ++k) more.insert(more.begin() + 1, -1);
            maps.push_back(more);  // sources and separate buffers, past 8 for nsrc >= 5
            std::vector<int> many = separate(11);
            many[3] = 0;
            many[9] = int(nsrc) - 1;
            maps.push_back(many);  // 11 destinations, two of them sources
            for (const auto& m : maps) {
              reduce_case c;
              c.t = t;
              c.op = op;
              c.nsrc = nsrc;
              c.count = count;
              c.align = align;
              c.dst_map = m;
              run_reduce(env, a, c, r);
            }
          }
    }
}

TEST_CASE_FIXTURE(
    kernel_test,
    "reduce with scales and a divisor (PREMUL_SUM, AVG) on floating and complex dtypes") {
  INFO("seed " << seed);
  for (dtype t : {dtype::float16, dtype::bfloat16, dtype::float32, dtype::float64, dtype::complex64,
                  dtype::complex128})
    for (std::size_t nsrc : {1, 2, 3, 8, 9, 17})
      for (std::size_t count : {1, 7, 1000, 100003})
        for (int align : {0, 1, 2})
          for (int variant = 0; variant < 5; ++variant) {
            reduce_case c;
            c.t = t;
            c.nsrc = nsrc;
            c.count = count;
            c.align = align;
            if (variant != 1) c.scales = random_scales(nsrc, r);
            if (variant != 0) c.divisor = variant == 2 ? double(nsrc) : 3.0;
            if (variant == 3) {  // in place, all sources written
              c.dst_map.resize(nsrc);
              std::iota(c.dst_map.begin(), c.dst_map.end(), 0);
            }
            if (variant == 4) {
              if (nsrc > 3) continue;  // products of few sources stay in float16 range
              c.op = reduce_op::PRODUCT;
            }
            run_reduce(env, a, c, r);
          }
}

TEST_CASE_FIXTURE(
    kernel_test,
    "NaN in any source gives NaN where the CPU kernels give it (SUM, PRODUCT, MIN, MAX)") {
  INFO("seed " << seed);
  constexpr std::size_t count = 1000;
  for (dtype t : {dtype::float16, dtype::bfloat16, dtype::float32, dtype::float64})
    for (kind op : {reduce_op::SUM, reduce_op::PRODUCT, reduce_op::MIN, reduce_op::MAX})
      for (std::size_t nsrc : {2, 9}) {
        INFO(to_string(op) << " " << to_string(t) << " nsrc=" << nsrc);
        const std::size_t es = element_size(t);
        std::vector<bytes_t> inputs;
        std::vector<const void*> host, srcs;
        for (std::size_t j = 0; j < nsrc; ++j) {
          inputs.push_back(random_elements(t, count, r));
          for (std::size_t i = j; i < count; i += 23) {  // quiet NaNs, in different sources
            const std::uint64_t nan = t == dtype::float16    ? 0x7e00
                                      : t == dtype::bfloat16 ? 0x7fc0
                                      : t == dtype::float32  ? 0x7fc00000
                                                             : 0x7ff8000000000000;
            std::memcpy(inputs[j].data() + i * es, &nan, es);
          }
          host.push_back(inputs[j].data());
          srcs.push_back(a.slot(j));
          env.upload(a.slot(j), inputs[j].data(), count * es);
        }
        bytes_t ref(count * es);
        detail::reduce_many(t, op, ref.data(), host.data(), nsrc, count);
        env.poison(a.slot(20), count * es);
        gpu::reduce_args args;
        args.type = t;
        args.op = op;
        args.count = count;
        args.srcs = srcs;
        args.dsts = {a.slot(20)};
        gpu::reduce(op_name, dev, args, env.s());
        env.sync();
        const bytes_t got = env.download(a.slot(20), count * es);
        std::size_t bad = 0, nans = 0;
        for (std::size_t i = 0; i < count; ++i) {
          const double e = part(t, ref.data(), i), g = part(t, got.data(), i);
          nans += std::isnan(e);
          const bool ok = std::isnan(e)
                              ? std::isnan(g)
                              : std::memcmp(ref.data() + i * es, got.data() + i * es, es) == 0;
          if (!ok && bad++ < 5) FAIL_CHECK("element " << i << ": got " << g << ", expected " << e);
        }
        CHECK(bad == 0);
        CHECK(nans > 0);
      }
}

TEST_CASE_FIXTURE(kernel_test, "scale and divide match scale_by and divide_by") {
  INFO("seed " << seed);
  for (dtype t : {dtype::float16, dtype::bfloat16, dtype::float32, dtype::float64, dtype::complex64,
                  dtype::complex128})
    for (std::size_t count : counts)
      for (int shifted : {0, 1})
        for (bool div : {false, true}) {
          INFO(to_string(t) << " count=" << count << " shifted=" << shifted << " divide=" << div);
          const std::size_t es = element_size(t), bytes = count * es;
          unsigned char* p = a.slot(0) + (shifted ? std::min<std::size_t>(es, 8) : 0);
          const bytes_t in = random_elements(t, count, r);
          const double f = 0.25 + 3 * r.uniform();
          env.poison(a.slot(0), bytes + 2 * es + 16);
          env.upload(p, in.data(), bytes);
          bytes_t ref = in;
          if (div) {
            detail::divide_by(t, ref.data(), count, f);
            gpu::divide(op_name, dev, t, p, count, f, env.s());
          } else {
            detail::scale_by(t, ref.data(), count, f);
            gpu::scale(op_name, dev, t, p, count, f, env.s());
          }
          env.sync();
          const bytes_t got = env.download(p, bytes + es);
          const std::string why = compare(t, got, ref, count, 1);
          CHECK_MESSAGE(why.empty(), why);
          CHECK(guard_intact(got, bytes));
        }
}

TEST_CASE_FIXTURE(kernel_test, "cast float32 <-> float16/bfloat16 matches the CPU conversions") {
  INFO("seed " << seed);
  for (dtype h : {dtype::float16, dtype::bfloat16}) {
    // Every 16-bit pattern to float32, at every offset pair of 0 and 1 element.
    std::vector<std::uint16_t> all(65536);
    std::iota(all.begin(), all.end(), std::uint16_t(0));
    for (std::size_t so : {0, 1})
      for (std::size_t dso : {0, 1}) {
        INFO(to_string(h) << " -> float32, offsets " << so << " " << dso);
        unsigned char* src = a.slot(0) + 2 * so;
        unsigned char* dst = a.slot(1) + 4 * dso;
        env.poison(a.slot(1), 65537 * 4 + 16);
        env.upload(src, all.data(), all.size() * 2);
        gpu::cast(op_name, dev, h, src, dtype::float32, dst, all.size(), env.s());
        env.sync();
        const bytes_t got = env.download(dst, 65537 * 4);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < all.size(); ++i) {
          float g;
          std::memcpy(&g, got.data() + 4 * i, 4);
          const float e = half_value(h, all[i]);
          const bool ok = std::isnan(e) ? std::isnan(g) : std::memcmp(&g, &e, 4) == 0;
          if (!ok && bad++ < 5)
            FAIL_CHECK("bits " << all[i] << ": got " << g << ", expected " << e);
        }
        CHECK(bad == 0);
        CHECK(guard_intact(got, all.size() * 4));
      }

    // float32 to 16 bits: special values, values spread over the exponent
    // range (subnormals, overflow, ties), and any 32-bit patterns.
    for (std::size_t count : counts)
      for (std::size_t so : {0, 1})
        for (std::size_t dso : {0, 1}) {
          INFO("float32 -> " << to_string(h) << " count=" << count << " offsets " << so << " "
                             << dso);
          std::vector<float> in(count);
          const float specials[] = {0.0f,
                                    -0.0f,
                                    1.0f,
                                    65504.0f,
                                    65519.0f,
                                    65520.0f,
                                    -65520.0f,
                                    1e-8f,
                                    5.960464e-8f,
                                    2.980232e-8f,
                                    1e30f,
                                    -1e-40f,
                                    INFINITY,
                                    -INFINITY,
                                    NAN,
                                    1.0f + 0x1.0p-11f,
                                    1.0f + 0x1.0p-8f,
                                    3.0e38f};
          for (std::size_t i = 0; i < count; ++i) {
            const std::uint64_t k = r.next();
            if (i < std::size(specials) && count < 1000) {
              in[i] = specials[i];
            } else if (k % 4 == 0) {
              const std::uint32_t bits = std::uint32_t(k >> 32);
              std::memcpy(&in[i], &bits, 4);
            } else {
              in[i] = float(std::ldexp(r.value(), int(k % 64) - 40));
            }
          }
          unsigned char* src = a.slot(0) + 4 * so;
          unsigned char* dst = a.slot(1) + 2 * dso;
          env.poison(a.slot(1), count * 2 + 32);
          env.upload(src, in.data(), count * 4);
          gpu::cast(op_name, dev, dtype::float32, src, h, dst, count, env.s());
          env.sync();
          const bytes_t got = env.download(dst, count * 2 + 2);
          std::size_t bad = 0;
          for (std::size_t i = 0; i < count; ++i) {
            std::uint16_t g;
            std::memcpy(&g, got.data() + 2 * i, 2);
            const std::uint16_t e = half_bits(h, in[i]);
            const bool ok = std::isnan(in[i]) ? half_is_nan(h, g) : g == e;
            if (!ok && bad++ < 5) FAIL_CHECK(in[i] << ": got bits " << g << ", expected " << e);
          }
          CHECK(bad == 0);
          CHECK(guard_intact(got, count * 2));
        }
  }
}

TEST_CASE_FIXTURE(kernel_test, "cast to the same dtype copies; other pairs are refused") {
  INFO("seed " << seed);
  for (dtype t : all_dtypes())
    for (std::size_t count : counts)
      for (int shifted : {0, 1}) {
        INFO(to_string(t) << " count=" << count << " shifted=" << shifted);
        const std::size_t es = element_size(t), bytes = count * es;
        const std::size_t shift = shifted ? std::min<std::size_t>(es, 8) : 0;
        const bytes_t in = random_elements(t, count, r);
        env.poison(a.slot(1), bytes + 2 * es + 16);
        env.upload(a.slot(0), in.data(), bytes);
        gpu::cast(op_name, dev, t, a.slot(0), t, a.slot(1) + shift, count, env.s());
        env.sync();
        const bytes_t got = env.download(a.slot(1) + shift, bytes + es);
        CHECK(std::equal(in.begin(), in.end(), got.begin()));
        CHECK(guard_intact(got, bytes));
      }
  for (auto [from, to] :
       {std::pair{dtype::int32, dtype::float32}, std::pair{dtype::float16, dtype::bfloat16},
        std::pair{dtype::float64, dtype::float32}, std::pair{dtype::float32, dtype::complex64}})
    check_error([&] { gpu::cast(op_name, dev, from, a.slot(0), to, a.slot(1), 4, env.s()); },
                errc::invalid_argument, {op_name, to_string(from), to_string(to)});
}

TEST_CASE("copy_segments copies many segments of odd sizes and alignments, nothing else") {
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  rng r{seed};
  gpu_env env;
  constexpr std::size_t src_bytes = 8 << 20, dst_bytes = 16 << 20;
  unsigned char* src = env.alloc(src_bytes);
  unsigned char* dst = env.alloc(dst_bytes);
  bytes_t in(src_bytes);
  for (auto& b : in) b = static_cast<unsigned char>(r.next());
  env.upload(src, in.data(), src_bytes);

  for (int round = 0; round < 4; ++round) {
    // Segments packed one after another into dst with gaps of 0 to 17 bytes;
    // sizes mostly small and odd, some large, some empty; any source offset.
    const std::size_t nseg = round == 0 ? 1 : round == 1 ? 128 : round == 2 ? 129 : 700;
    std::vector<gpu::copy_segment> segs;
    bytes_t expected(dst_bytes, 0xFF);
    std::size_t at = r.next() % 16;
    for (std::size_t k = 0; k < nseg; ++k) {
      const std::uint64_t x = r.next();
      std::size_t bytes = x % 7 == 0 ? 0 : x % 11 == 0 ? 100000 + x % 900001 : x % 5000;
      if (round == 0) bytes = 3 << 20;
      if (at + bytes + 32 > dst_bytes) bytes = 0;
      const std::size_t from = (x >> 32) % (src_bytes - bytes);
      if (k % 3 == 0) at = (at + 15) / 16 * 16 + from % 16;  // the same alignment as the source
      segs.push_back({dst + at, src + from, bytes});
      std::memcpy(expected.data() + at, in.data() + from, bytes);
      at += bytes + (x >> 20) % 18;
    }
    segs.push_back({nullptr, nullptr, 0});  // empty segments may have no memory
    INFO("round " << round << ": " << nseg << " segments, " << at << " bytes");
    env.poison(dst, dst_bytes);
    gpu::copy_segments(op_name, dev, segs, env.s());
    env.sync();
    const bytes_t got = env.download(dst, dst_bytes);
    std::size_t first_bad = dst_bytes;
    for (std::size_t i = 0; i < dst_bytes && first_bad == dst_bytes; ++i)
      if (got[i] != expected[i]) first_bad = i;
    CHECK_MESSAGE(first_bad == dst_bytes, "byte " << first_bad << " differs");
  }
  gpu::copy_segments(op_name, dev, {}, env.s());  // nothing to do
  env.sync();
  check_error(
      [&] {
        gpu::copy_segments(op_name, dev, {{dst, src, 16}, {nullptr, src, 8}}, env.s());
      },
      errc::invalid_argument, {op_name, "segment 1", "null"});
}

TEST_CASE("invalid arguments throw invalid_argument naming the call") {
  gpu_env env;
  arena a(env);
  const auto make_args = [&](dtype t, kind op, std::size_t nsrc, std::size_t ndst,
                             std::vector<double> scales = {}, double divisor = 0,
                             std::size_t count = 4) {
    gpu::reduce_args args;
    args.type = t;
    args.op = op;
    args.count = count;
    for (std::size_t j = 0; j < nsrc; ++j) args.srcs.push_back(a.slot(j));
    for (std::size_t k = 0; k < ndst; ++k) args.dsts.push_back(a.slot(20 + k));
    args.scales = std::move(scales);
    args.divisor = divisor;
    return args;
  };
  const auto fails = [&](gpu::reduce_args args, std::initializer_list<std::string_view> words) {
    check_error([&] { gpu::reduce(op_name, dev, args, env.s()); }, errc::invalid_argument, words);
  };
  fails(make_args(dtype::float32, reduce_op::SUM, 0, 1), {op_name, "source"});
  fails(make_args(dtype::float32, reduce_op::SUM, 0, 1, {}, 0, 0), {op_name, "source"});
  fails(make_args(dtype::float32, reduce_op::SUM, 2, 0), {op_name, "destination"});
  fails(make_args(dtype::float32, reduce_op::AVG, 2, 1), {op_name, "AVG", "divisor"});
  fails(make_args(dtype::float32, reduce_op::PREMUL_SUM, 2, 1), {op_name, "PREMUL_SUM", "scales"});
  fails(make_args(dtype::float32, reduce_op::BAND, 2, 1), {op_name, "BAND", "float32"});
  fails(make_args(dtype::bfloat16, reduce_op::BXOR, 2, 1), {op_name, "BXOR", "bfloat16"});
  fails(make_args(dtype::complex64, reduce_op::MIN, 2, 1), {op_name, "MIN", "complex64"});
  fails(make_args(dtype::complex128, reduce_op::MAX, 2, 1), {op_name, "MAX", "complex128"});
  fails(make_args(dtype::int32, reduce_op::SUM, 2, 1, {1.0, 2.0}), {op_name, "scales", "int32"});
  fails(make_args(dtype::bool_, reduce_op::SUM, 2, 1, {}, 2.0), {op_name, "divisor", "bool"});
  fails(make_args(dtype::float32, reduce_op::SUM, 3, 1, {1.0, 2.0}),
        {op_name, "2 scales", "3 sources"});
  auto null_src = make_args(dtype::float32, reduce_op::SUM, 3, 1);
  null_src.srcs[1] = nullptr;
  fails(null_src, {op_name, "source 1", "null"});
  auto null_dst = make_args(dtype::float32, reduce_op::SUM, 3, 2);
  null_dst.dsts[1] = nullptr;
  fails(null_dst, {op_name, "destination 1", "null"});
  auto odd = make_args(dtype::float32, reduce_op::SUM, 2, 1);
  odd.dsts[0] = a.slot(20) + 1;
  fails(odd, {op_name, "destination 0", "aligned", "float32"});

  check_error([&] { gpu::scale(op_name, dev, dtype::int32, a.slot(0), 4, 2.0, env.s()); },
              errc::invalid_argument, {op_name, "int32"});
  check_error([&] { gpu::divide(op_name, dev, dtype::bool_, a.slot(0), 4, 2.0, env.s()); },
              errc::invalid_argument, {op_name, "bool"});

  // Nothing to do is no error: count 0 with null pointers.
  auto empty = make_args(dtype::float32, reduce_op::SUM, 2, 1, {}, 0, 0);
  empty.srcs[0] = nullptr;
  CHECK_NOTHROW(gpu::reduce(op_name, dev, empty, env.s()));
  CHECK_NOTHROW(gpu::scale(op_name, dev, dtype::float32, nullptr, 0, 2.0, env.s()));
  env.sync();
}

TEST_CASE("a failed launch throws the CUDA error naming the call and the dev") {
  gpu_env env;
  // (CUDA 12 calls 4096 threads a block an invalid configuration, CUDA 13 an
  // invalid value: the message carries CUDA's words and the error's name.)
  check_error([&] { gpu::launch_invalid_for_test(op_name, dev, env.s()); }, errc::backend,
              {op_name, "cuda:0", "invalid_kernel failed: ", " (cudaError"});
  // The error is not sticky: the next launch works.
  CUDA_REQUIRE(cudaGetLastError());
  arena a(env);
  const float one = 1.0f;
  env.upload(a.slot(0), &one, 4);
  gpu::reduce_args args;
  args.count = 1;
  args.srcs = {a.slot(0), a.slot(0)};
  args.dsts = {a.slot(1)};
  gpu::reduce(op_name, dev, args, env.s());
  env.sync();
  const bytes_t got = env.download(a.slot(1), 4);
  float two;
  std::memcpy(&two, got.data(), 4);
  CHECK(two == 2.0f);
}

#else  // !TROUPE_HAVE_CUDA

TEST_CASE("the GPU kernels need a build with CUDA") {}

#endif
