// troupe's own CUDA kernels: element-wise reduction of several buffers into
// several buffers (reduce, and scale and divide through it), float32 <->
// float16/bfloat16 conversion (cast), batched copies (copy_segments), and a
// launch that fails on purpose (launch_invalid_for_test).
//
// Terms:
// - slot: one of the `slots` source and destination pointers that a launch
//   takes by value in its parameters.
// - vector: 16 bytes of elements, loaded and stored with one instruction. A
//   launch uses vectors when all its pointers have the same address modulo
//   16: the scalar *head* brings them to a 16-byte boundary, the scalar *tail*
//   ends what vectors do not cover. Each thread has several vectors (or
//   scalars) in flight per step of its grid-stride loop.
// - fold: a reduction of more sources than a launch takes. The first launch
//   reduces 8 sources into the *carry*, each next launch reduces the carry
//   and the next sources into it, and the last one divides and writes the
//   destinations; destinations past the slots get a copy of the first one.
//   The carry is a destination that no later source overlaps, or scratch
//   memory; for float16/bfloat16 always float32 scratch, so that they round
//   once.
//
// Kernels are templated on the dtype (12 instantiations of the reduction);
// the op is a switch that selects a per-op loop. Arithmetic matches the CPU
// kernels (kernels/reduce_kernels.cpp): no multiply-add contraction, integer
// SUM/PRODUCT wrap around, floating MIN/MAX propagate NaN.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "cuda/kernels.hpp"
#include "kernels/combine_exact.hpp"
#include "troupe/error.hpp"

namespace troupe::detail::gpu {
namespace {

using kind = reduce_op::kind;

constexpr int slots = 8;          // sources and destinations per launch
constexpr int threads = 256;      // per block
constexpr int blocks_per_sm = 4;  // resident at once with __launch_bounds__(threads, 4)
constexpr int unroll = 4;         // items (vectors or scalars) in flight per thread

// --- element types ------------------------------------------------------------
// storage: the element in memory; acc: what it is combined in; scale_t: the
// type of scales and divisors (floating and complex only); rounds: acc is
// wider than storage (float16/bfloat16), so a fold carries float32.

struct cfloat {  // complex64, aligned like std::complex<float>
  float re, im;
};
struct cdouble {  // complex128, aligned like std::complex<double>
  double re, im;
};

__device__ __forceinline__ float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double mul_rn(double a, double b) {
  return __dmul_rn(a, b);
}
__device__ __forceinline__ float sub_rn(float a, float b) {
  return __fsub_rn(a, b);
}
__device__ __forceinline__ double sub_rn(double a, double b) {
  return __dsub_rn(a, b);
}
__device__ __forceinline__ float add_rn(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ double add_rn(double a, double b) {
  return __dadd_rn(a, b);
}

template <class T>
struct int_elem {
  using storage = T;
  using acc = T;
  using scale_t = void;
  static constexpr bool floating = false, rounds = false;
  __device__ static acc load(storage s) { return s; }
  __device__ static storage store(acc a) { return a; }
  template <kind K>
  __device__ static T op(T a, T b) {
    return combine_int<K>(a, b);  // the CPU kernels' (kernels/combine_exact.hpp)
  }
};

// bool as bytes: any non-zero byte is true, results are 0 or 1.
struct bool_elem : int_elem<std::uint8_t> {
  template <kind K>
  __device__ static std::uint8_t op(std::uint8_t a, std::uint8_t b) {
    return combine_bool<K>(a, b);  // the CPU kernels' (kernels/combine_exact.hpp)
  }
};

template <class R>
struct real_elem {
  using storage = R;
  using acc = R;
  using scale_t = R;
  static constexpr bool floating = true, rounds = false;
  __device__ static acc load(storage s) { return s; }
  __device__ static storage store(acc a) { return a; }
  template <kind K>
  __device__ static R op(R a, R b) {
    if constexpr (K == reduce_op::SUM) return add_rn(a, b);
    if constexpr (K == reduce_op::PRODUCT) return mul_rn(a, b);
    // NaN in either operand propagates (a NaN `a` is kept because both tests fail).
    if constexpr (K == reduce_op::MIN) return ((b < a) | (b != b)) ? b : a;
    if constexpr (K == reduce_op::MAX) return ((b > a) | (b != b)) ? b : a;
  }
  __device__ static R scale(R a, R f) { return mul_rn(a, f); }
  __device__ static R divide(R a, R d) { return a / d; }
};

struct float16_elem : real_elem<float> {
  using storage = std::uint16_t;
  static constexpr bool rounds = true;
  __device__ static float load(storage s) { return __half2float(__ushort_as_half(s)); }
  __device__ static storage store(float a) { return __half_as_ushort(__float2half_rn(a)); }
};

struct bfloat16_elem : real_elem<float> {
  using storage = std::uint16_t;
  static constexpr bool rounds = true;
  __device__ static float load(storage s) { return __bfloat162float(__ushort_as_bfloat16(s)); }
  __device__ static storage store(float a) { return __bfloat16_as_ushort(__float2bfloat16_rn(a)); }
};

// Complex SUM adds parts; PRODUCT is the plain (ac - bd, ad + bc), like the CPU kernels.
template <class C, class R>
struct complex_elem {
  using storage = C;
  using acc = C;
  using scale_t = R;
  static constexpr bool floating = true, rounds = false;
  __device__ static acc load(storage s) { return s; }
  __device__ static storage store(acc a) { return a; }
  template <kind K>
  __device__ static C op(C a, C b) {
    if constexpr (K == reduce_op::PRODUCT)
      return {sub_rn(mul_rn(a.re, b.re), mul_rn(a.im, b.im)),
              add_rn(mul_rn(a.re, b.im), mul_rn(a.im, b.re))};
    else
      return {add_rn(a.re, b.re), add_rn(a.im, b.im)};
  }
  __device__ static C scale(C a, R f) { return {mul_rn(a.re, f), mul_rn(a.im, f)}; }
  __device__ static C divide(C a, R d) { return {a.re / d, a.im / d}; }
};

template <dtype D>
struct elem_of;
template <>
struct elem_of<dtype::bool_> : bool_elem {};
template <>
struct elem_of<dtype::uint8> : int_elem<std::uint8_t> {};
template <>
struct elem_of<dtype::int8> : int_elem<std::int8_t> {};
template <>
struct elem_of<dtype::int16> : int_elem<std::int16_t> {};
template <>
struct elem_of<dtype::int32> : int_elem<std::int32_t> {};
template <>
struct elem_of<dtype::int64> : int_elem<std::int64_t> {};
template <>
struct elem_of<dtype::float16> : float16_elem {};
template <>
struct elem_of<dtype::bfloat16> : bfloat16_elem {};
template <>
struct elem_of<dtype::float32> : real_elem<float> {};
template <>
struct elem_of<dtype::float64> : real_elem<double> {};
template <>
struct elem_of<dtype::complex64> : complex_elem<cfloat, float> {};
template <>
struct elem_of<dtype::complex128> : complex_elem<cdouble, double> {};

// Elements per 16-byte vector.
template <dtype D>
constexpr int vec_elems = 16 / sizeof(typename elem_of<D>::storage);
// Vectors in flight per thread: `unroll`, fewer for small elements (16 or
// more per thread and source), so that accumulators fit in registers.
template <dtype D>
constexpr int vec_unroll = vec_elems<D> >= 16  ? 1
                           : vec_elems<D> >= 8 ? 2
                                               : unroll;

// The (op, dtype) pairs with a kernel: is_reduce_supported() without AVG and
// PREMUL_SUM (which reach the kernel as SUM).
template <dtype D, kind K>
constexpr bool has_kernel() {
  constexpr bool complex = D == dtype::complex64 || D == dtype::complex128;
  constexpr bool floating = complex || D == dtype::float16 || D == dtype::bfloat16 ||
                            D == dtype::float32 || D == dtype::float64;
  switch (K) {
    case reduce_op::SUM:
    case reduce_op::PRODUCT:
      return true;
    case reduce_op::MIN:
    case reduce_op::MAX:
      return !complex;
    case reduce_op::BAND:
    case reduce_op::BOR:
    case reduce_op::BXOR:
      return !floating;
    default:
      return false;
  }
}

// M elements of S as M * sizeof(S) / 16 vectors.
template <class S, int M>
union packed {
  static_assert(M * sizeof(S) % 16 == 0);
  uint4 raw[M * sizeof(S) / 16];
  S e[M];
};

// Loads (stores) M elements at p: one scalar, or (Vec) from a 16-byte aligned
// address in vectors.
template <class S, int M, bool Vec>
__device__ __forceinline__ void load_elems(const S* p, S (&e)[M]) {
  if constexpr (!Vec) {
    static_assert(M == 1);
    e[0] = *p;
  } else {
    packed<S, M> v;
#pragma unroll
    for (int k = 0; k < M * int(sizeof(S)) / 16; ++k)
      v.raw[k] = reinterpret_cast<const uint4*>(p)[k];
#pragma unroll
    for (int m = 0; m < M; ++m) e[m] = v.e[m];
  }
}

template <class S, int M, bool Vec>
__device__ __forceinline__ void store_elems(S* p, const S (&e)[M]) {
  if constexpr (!Vec) {
    static_assert(M == 1);
    *p = e[0];
  } else {
    packed<S, M> v;
#pragma unroll
    for (int m = 0; m < M; ++m) v.e[m] = e[m];
#pragma unroll
    for (int k = 0; k < M * int(sizeof(S)) / 16; ++k) reinterpret_cast<uint4*>(p)[k] = v.raw[k];
  }
}

// --- reduce ---------------------------------------------------------------------

struct reduce_params {
  const void* srcs[slots];
  void* dsts[slots];
  double scales[slots];   // used for the sources whose bit is set in scaled
  const float* carry_in;  // float16/bfloat16 fold: the result so far, combined first
  float* carry_out;       // float16/bfloat16 fold: written instead of the destinations
  std::size_t count;      // elements
  std::size_t head;       // scalar elements before the first vector
  std::size_t nvec;       // vectors after the head
  double divisor;         // used when divided
  int nsrc, ndst;
  unsigned scaled;  // bit j: multiply source j by scales[j]
  bool divided;
  kind op;
};

// Reduces U items (vectors when Vec, else single elements) that start
// at the elements at[u] (where ok[u]); every source is read before anything
// is written.
template <dtype D, kind K, bool Vec, int U>
__device__ __forceinline__ void reduce_items(const reduce_params& p, const std::size_t (&at)[U],
                                             const bool (&ok)[U]) {
  constexpr int M = Vec ? vec_elems<D> : 1;
  using E = elem_of<D>;
  using S = typename E::storage;
  using A = typename E::acc;
  A acc[U][M];
  bool carried = false;
  if constexpr (E::rounds) {
    if (p.carry_in) {
      carried = true;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float c[M] = {};
        if (ok[u]) load_elems<float, M, Vec>(p.carry_in + at[u], c);
#pragma unroll
        for (int m = 0; m < M; ++m) acc[u][m] = c[m];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < slots; ++j) {
    if (j >= p.nsrc) break;
    const S* src = static_cast<const S*>(p.srcs[j]);
    A x[U][M];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      S s[M] = {};
      if (ok[u]) load_elems<S, M, Vec>(src + at[u], s);
#pragma unroll
      for (int m = 0; m < M; ++m) x[u][m] = E::load(s[m]);
    }
    if constexpr (E::floating) {
      if (p.scaled & (1u << j)) {
        const auto f = static_cast<typename E::scale_t>(p.scales[j]);
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int m = 0; m < M; ++m) x[u][m] = E::scale(x[u][m], f);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int m = 0; m < M; ++m)
        acc[u][m] = (j == 0 && !carried) ? x[u][m] : E::template op<K>(acc[u][m], x[u][m]);
  }
  if constexpr (E::rounds) {
    if (p.carry_out) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (ok[u]) store_elems<float, M, Vec>(p.carry_out + at[u], acc[u]);
      return;
    }
  }
  if constexpr (E::floating) {
    if (p.divided) {
      const auto d = static_cast<typename E::scale_t>(p.divisor);
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[u][m] = E::divide(acc[u][m], d);
    }
  }
  S out[U][M];
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int m = 0; m < M; ++m) out[u][m] = E::store(acc[u][m]);
#pragma unroll
  for (int j = 0; j < slots; ++j) {
    if (j >= p.ndst) break;
    S* dst = static_cast<S*>(p.dsts[j]);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (ok[u]) store_elems<S, M, Vec>(dst + at[u], out[u]);
  }
}

// The per-op loop: vectors, then head and tail elements; both grid-stride
// with several items per thread per step, the items of one step a grid
// apart so that a warp's accesses are contiguous.
template <dtype D, kind K>
__device__ void reduce_loop(const reduce_params& p) {
  if constexpr (has_kernel<D, K>()) {
    constexpr int n = vec_elems<D>, uv = vec_unroll<D>;
    const std::size_t tid = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
    for (std::size_t v = tid; v < p.nvec; v += stride * uv) {
      std::size_t at[uv];
      bool ok[uv];
#pragma unroll
      for (int u = 0; u < uv; ++u) {
        const std::size_t w = v + u * stride;
        ok[u] = w < p.nvec;
        at[u] = p.head + w * n;
      }
      reduce_items<D, K, true>(p, at, ok);
    }
    const std::size_t vec_end = p.head + p.nvec * n;
    const std::size_t nscalar = p.count - p.nvec * n;
    for (std::size_t k = tid; k < nscalar; k += stride * unroll) {
      std::size_t at[unroll];
      bool ok[unroll];
#pragma unroll
      for (int u = 0; u < unroll; ++u) {
        const std::size_t w = k + u * stride;
        ok[u] = w < nscalar;
        at[u] = w < p.head ? w : vec_end + (w - p.head);
      }
      reduce_items<D, K, false>(p, at, ok);
    }
  }
}

template <dtype D>
__global__ void __launch_bounds__(threads, blocks_per_sm) reduce_kernel(const reduce_params p) {
  switch (p.op) {
    case reduce_op::SUM:
      return reduce_loop<D, reduce_op::SUM>(p);
    case reduce_op::PRODUCT:
      return reduce_loop<D, reduce_op::PRODUCT>(p);
    case reduce_op::MIN:
      return reduce_loop<D, reduce_op::MIN>(p);
    case reduce_op::MAX:
      return reduce_loop<D, reduce_op::MAX>(p);
    case reduce_op::BAND:
      return reduce_loop<D, reduce_op::BAND>(p);
    case reduce_op::BOR:
      return reduce_loop<D, reduce_op::BOR>(p);
    case reduce_op::BXOR:
      return reduce_loop<D, reduce_op::BXOR>(p);
    default:
      return;
  }
}

// --- cast -------------------------------------------------------------------------

// dst[i] = (To) src[i] through float; vectors of 8 elements (16 bytes of the
// 2-byte side, 32 of the float32 side) after `head` scalars.
template <dtype From, dtype To>
__global__ void __launch_bounds__(threads, blocks_per_sm)
    cast_kernel(const void* src, void* dst, std::size_t count, std::size_t head, std::size_t nvec) {
  using F = elem_of<From>;
  using T = elem_of<To>;
  using SF = typename F::storage;
  using ST = typename T::storage;
  constexpr int n = 8;
  const auto* s = static_cast<const SF*>(src);
  auto* d = static_cast<ST*>(dst);
  const std::size_t tid = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t v = tid; v < nvec; v += stride * unroll) {
    SF in[unroll][n];
#pragma unroll
    for (int u = 0; u < unroll; ++u)
      if (v + u * stride < nvec) load_elems<SF, n, true>(s + head + (v + u * stride) * n, in[u]);
#pragma unroll
    for (int u = 0; u < unroll; ++u) {
      if (v + u * stride >= nvec) continue;
      ST out[n];
#pragma unroll
      for (int m = 0; m < n; ++m) out[m] = T::store(F::load(in[u][m]));
      store_elems<ST, n, true>(d + head + (v + u * stride) * n, out);
    }
  }
  const std::size_t vec_end = head + nvec * n;
  for (std::size_t k = tid; k < count - nvec * n; k += stride) {
    const std::size_t i = k < head ? k : vec_end + (k - head);
    d[i] = T::store(F::load(s[i]));
  }
}

// --- copy_segments ----------------------------------------------------------------

constexpr int segments_per_launch = 128;  // 3 KiB of parameters

struct segment_params {
  copy_segment seg[segments_per_launch];
};

// Copies one segment in words of W: bytes up to the dst's W boundary, words
// (`unroll` in flight per thread), then the remaining bytes. dst and src have
// the same address modulo sizeof(W).
template <class W>
__device__ void copy_words(unsigned char* d, const unsigned char* s, std::size_t bytes) {
  constexpr std::size_t w = sizeof(W);
  const std::size_t head = std::min(bytes, (w - reinterpret_cast<std::uintptr_t>(d) % w) % w);
  const std::size_t nwords = (bytes - head) / w;
  const std::size_t words_end = head + nwords * w;
  const std::size_t tid = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  auto* dw = reinterpret_cast<W*>(d + head);
  const auto* sw = reinterpret_cast<const W*>(s + head);
  for (std::size_t i = tid; i < nwords; i += stride * unroll) {
    W v[unroll];
#pragma unroll
    for (int u = 0; u < unroll; ++u)
      if (i + u * stride < nwords) v[u] = sw[i + u * stride];
#pragma unroll
    for (int u = 0; u < unroll; ++u)
      if (i + u * stride < nwords) dw[i + u * stride] = v[u];
  }
  for (std::size_t k = tid; k < head + (bytes - words_end); k += stride) {
    const std::size_t i = k < head ? k : words_end + (k - head);
    d[i] = s[i];
  }
}

// blockIdx.y is the segment; the widest word in which dst and src agree on alignment.
__global__ void __launch_bounds__(threads, blocks_per_sm) copy_kernel(const segment_params p) {
  const copy_segment g = p.seg[blockIdx.y];
  auto* d = static_cast<unsigned char*>(g.dst);
  const auto* s = static_cast<const unsigned char*>(g.src);
  const auto diff = reinterpret_cast<std::uintptr_t>(d) ^ reinterpret_cast<std::uintptr_t>(s);
  if (diff % 16 == 0)
    copy_words<uint4>(d, s, g.bytes);
  else if (diff % 8 == 0)
    copy_words<uint2>(d, s, g.bytes);
  else if (diff % 4 == 0)
    copy_words<unsigned>(d, s, g.bytes);
  else if (diff % 2 == 0)
    copy_words<unsigned short>(d, s, g.bytes);
  else
    copy_words<unsigned char>(d, s, g.bytes);
}

__global__ void invalid_kernel() {}

// --- host side --------------------------------------------------------------------

[[noreturn]] void invalid(const std::string& message) {
  throw error(errc::invalid_argument, message);
}

std::string name(dtype t) {
  return std::string(to_string(t));
}

bool is_half(dtype t) {
  return t == dtype::float16 || t == dtype::bfloat16;
}

// The alignment of an element (that of its real part for complex dtypes).
std::size_t element_alignment(dtype t) {
  return is_complex(t) ? element_size(t) / 2 : element_size(t);
}

std::uintptr_t address(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

// SMs of `device`, asked once per device (a process-wide cache of a constant).
int sm_count(const char* op, int device) {
  constexpr int cached = 64;
  static std::atomic<int> counts[cached];
  if (device >= 0 && device < cached) {
    const int n = counts[device].load(std::memory_order_relaxed);
    if (n > 0) return n;
  }
  int n = 0;
  check(op, device, "cudaDeviceGetAttribute",
        int(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device)));
  n = std::max(n, 1);
  if (device >= 0 && device < cached) counts[device].store(n, std::memory_order_relaxed);
  return n;
}

// Blocks for `steps` steps of one thread, at most what is resident at once.
unsigned grid_for(const char* op, int device, std::size_t steps) {
  const std::size_t want = std::max<std::size_t>(1, (steps + threads - 1) / threads);
  return unsigned(std::min<std::size_t>(want, std::size_t(sm_count(op, device)) * blocks_per_sm));
}

cudaStream_t native(stream_t s) {
  return static_cast<cudaStream_t>(s);
}

template <dtype D>
void launch_reduce(const char* op, int device, const reduce_params& p, stream_t s) {
  const std::size_t steps = (p.nvec + vec_unroll<D> - 1) / vec_unroll<D> +
                            (p.count - p.nvec * vec_elems<D> + unroll - 1) / unroll;
  reduce_kernel<D><<<grid_for(op, device, steps), threads, 0, native(s)>>>(p);
  check_launch(op, device, "reduce_kernel");
}

// Sets head and nvec: vectors when every pointer has the same address modulo
// 16, whole elements reach the next 16-byte boundary (not so for complex128
// at 8 bytes past one) and the float32 carry, if any, is aligned at the head;
// else scalars only.
void plan_vectors(reduce_params& p, std::size_t esize) {
  const std::uintptr_t mis = address(p.srcs[0]) % 16;
  bool same = (16 - mis) % 16 % esize == 0;
  for (int j = 0; j < p.nsrc; ++j) same = same && address(p.srcs[j]) % 16 == mis;
  for (int j = 0; j < p.ndst; ++j) same = same && address(p.dsts[j]) % 16 == mis;
  const std::size_t head = std::min(p.count, ((16 - mis) % 16) / esize);
  for (const float* c : {p.carry_in, static_cast<const float*>(p.carry_out)})
    if (c) same = same && address(c + head) % 16 == 0;
  p.head = same ? head : p.count;
  p.nvec = same ? (p.count - head) / (16 / esize) : 0;
}

void dispatch_reduce(const char* op, int device, dtype t, reduce_params& p, stream_t s) {
  plan_vectors(p, element_size(t));
  switch (t) {
    case dtype::bool_:
      return launch_reduce<dtype::bool_>(op, device, p, s);
    case dtype::uint8:
      return launch_reduce<dtype::uint8>(op, device, p, s);
    case dtype::int8:
      return launch_reduce<dtype::int8>(op, device, p, s);
    case dtype::int16:
      return launch_reduce<dtype::int16>(op, device, p, s);
    case dtype::int32:
      return launch_reduce<dtype::int32>(op, device, p, s);
    case dtype::int64:
      return launch_reduce<dtype::int64>(op, device, p, s);
    case dtype::float16:
      return launch_reduce<dtype::float16>(op, device, p, s);
    case dtype::bfloat16:
      return launch_reduce<dtype::bfloat16>(op, device, p, s);
    case dtype::float32:
      return launch_reduce<dtype::float32>(op, device, p, s);
    case dtype::float64:
      return launch_reduce<dtype::float64>(op, device, p, s);
    case dtype::complex64:
      return launch_reduce<dtype::complex64>(op, device, p, s);
    case dtype::complex128:
      return launch_reduce<dtype::complex128>(op, device, p, s);
  }
  invalid(std::string(op) + ": unknown dtype " + std::to_string(int(t)));
}

// Byte-exact copies of `src` (count elements of size esize) into dsts, up to
// `slots` per launch, as the integer dtype of the element's size.
void copy_into(const char* op, int device, std::size_t esize, const void* src, std::size_t count,
               void* const* dsts, std::size_t ndst, stream_t s) {
  dtype as = dtype::uint8;
  if (esize == 2) as = dtype::int16;
  if (esize == 4) as = dtype::int32;
  if (esize >= 8) as = dtype::int64;
  const std::size_t n = count * (esize / element_size(as));
  for (std::size_t k = 0; k < ndst;) {
    reduce_params p{};
    p.op = reduce_op::SUM;
    p.count = n;
    p.nsrc = 1;
    p.srcs[0] = src;
    for (; k < ndst && p.ndst < slots; ++k)
      if (dsts[k] != src) p.dsts[p.ndst++] = dsts[k];
    if (p.ndst > 0) dispatch_reduce(op, device, as, p, s);
  }
}

// Stream-ordered scratch memory, freed (in stream order) when it goes away.
class scratch {
 public:
  scratch(const char* op, int device, std::size_t bytes, stream_t s) : s_(s) {
    check(op, device, "cudaMallocAsync", int(cudaMallocAsync(&p_, bytes, native(s))));
  }
  ~scratch() { (void)cudaFreeAsync(p_, native(s_)); }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  unsigned char* get() const { return static_cast<unsigned char*>(p_); }

 private:
  stream_t s_;
  void* p_ = nullptr;
};

bool overlaps(const void* a, const void* b, std::size_t bytes) {
  return address(a) < address(b) + bytes && address(b) < address(a) + bytes;
}

void check_pointer(const char* op, const char* what, std::size_t k, const void* p, dtype t) {
  if (!p) invalid(std::string(op) + ": " + what + " " + std::to_string(k) + " is null");
  if (address(p) % element_alignment(t) != 0)
    invalid(std::string(op) + ": " + what + " " + std::to_string(k) +
            " is not aligned to its dtype " + name(t));
}

void check_floating(const char* op, const char* what, dtype t) {
  if (!is_floating_point(t) && !is_complex(t))
    invalid(std::string(op) + ": " + what + " needs a floating point or complex dtype, not " +
            name(t));
}

void check_dtype(const char* op, dtype t) {
  if (static_cast<int>(t) >= dtype_count)
    invalid(std::string(op) + ": unknown dtype " + std::to_string(int(t)));
}

void validate(const char* op, const reduce_args& a) {
  check_dtype(op, a.type);
  if (a.op == reduce_op::AVG || a.op == reduce_op::PREMUL_SUM)
    invalid(std::string(op) + ": ReduceOp " + to_string(a.op) +
            " is not a kernel op (pass SUM with " +
            (a.op == reduce_op::AVG ? "a divisor" : "scales") + ")");
  if (!is_reduce_supported(a.op, a.type))
    invalid(std::string(op) + ": ReduceOp " + to_string(a.op) + " is not supported for dtype " +
            name(a.type));
  if (a.srcs.empty()) invalid(std::string(op) + ": a reduction needs at least one source");
  if (a.dsts.empty()) invalid(std::string(op) + ": a reduction needs at least one destination");
  if (!a.scales.empty()) {
    check_floating(op, "scales (PREMUL_SUM)", a.type);
    if (a.scales.size() != a.srcs.size())
      invalid(std::string(op) + ": " + std::to_string(a.scales.size()) + " scales for " +
              std::to_string(a.srcs.size()) + " sources");
  }
  if (a.divisor != 0.0) check_floating(op, "a divisor (AVG)", a.type);
  if (a.count == 0) return;
  for (std::size_t k = 0; k < a.srcs.size(); ++k) check_pointer(op, "source", k, a.srcs[k], a.type);
  for (std::size_t k = 0; k < a.dsts.size(); ++k)
    check_pointer(op, "destination", k, a.dsts[k], a.type);
}

}  // namespace

void reduce(const char* op, int device, const reduce_args& a, stream_t s) {
  validate(op, a);
  if (a.count == 0) return;
  const std::size_t esize = element_size(a.type);
  const std::size_t bytes = a.count * esize;
  const std::size_t nsrc = a.srcs.size(), ndst = a.dsts.size();
  const bool scaled = !a.scales.empty(), divided = a.divisor != 0.0;

  // One source, nothing to scale or divide: byte copies.
  if (nsrc == 1 && !scaled && !divided)
    return copy_into(op, device, esize, a.srcs[0], a.count, a.dsts.data(), ndst, s);

  // The carry of a fold: a destination that no source after the first
  // launch overlaps, else scratch with the alignment of the first source;
  // float32 scratch for float16/bfloat16.
  const bool fold = nsrc > slots;
  void* carry = nullptr;
  float* carry_f = nullptr;
  std::unique_ptr<scratch> buffer;
  if (fold && is_half(a.type)) {
    buffer = std::make_unique<scratch>(op, device, (a.count + 4) * sizeof(float), s);
    const std::size_t head = ((16 - address(a.srcs[0]) % 16) % 16) / esize;
    carry_f = reinterpret_cast<float*>(buffer->get()) + (4 - head % 4) % 4;
  } else if (fold) {
    for (std::size_t k = 0; k < ndst && !carry; ++k) {
      const bool safe = std::none_of(a.srcs.begin() + slots, a.srcs.end(), [&](const void* src) {
        return overlaps(src, a.dsts[k], bytes);
      });
      if (safe) carry = a.dsts[k];
    }
    if (!carry) {
      buffer = std::make_unique<scratch>(op, device, bytes + 16, s);
      carry = buffer->get() + address(a.srcs[0]) % 16;
    }
  }

  // Each launch: the carry (after the first), the next sources; into the
  // carry, or (the last) divided into the first `slots` destinations.
  for (std::size_t j = 0; j < nsrc;) {
    reduce_params p{};
    p.op = a.op;
    p.count = a.count;
    if (j > 0) {
      if (carry_f) {
        p.carry_in = carry_f;
      } else {
        p.srcs[0] = carry;
        p.nsrc = 1;
      }
    }
    for (; j < nsrc && p.nsrc < slots; ++j, ++p.nsrc) {
      p.srcs[p.nsrc] = a.srcs[j];
      if (scaled) {
        p.scales[p.nsrc] = a.scales[j];
        p.scaled |= 1u << p.nsrc;
      }
    }
    if (j < nsrc) {
      if (carry_f) {
        p.carry_out = carry_f;
      } else {
        p.dsts[0] = carry;
        p.ndst = 1;
      }
    } else {
      for (; p.ndst < slots && std::size_t(p.ndst) < ndst; ++p.ndst)
        p.dsts[p.ndst] = a.dsts[p.ndst];
      p.divided = divided;
      p.divisor = a.divisor;
    }
    dispatch_reduce(op, device, a.type, p, s);
  }

  // Destinations past the slots: copies of the first.
  if (ndst > slots)
    copy_into(op, device, esize, a.dsts[0], a.count, a.dsts.data() + slots, ndst - slots, s);
}

namespace {

/// data[i] = data[i] * factor (scaled) or data[i] / divisor (divided): a
/// one-source reduction in place.
void in_place(const char* op, const char* what, int device, dtype t, void* data, std::size_t n,
              bool scaled, double factor, bool divided, double divisor, stream_t s) {
  check_dtype(op, t);
  check_floating(op, what, t);
  if (n == 0) return;
  check_pointer(op, "buffer", 0, data, t);
  reduce_params p{};
  p.op = reduce_op::SUM;
  p.count = n;
  p.nsrc = p.ndst = 1;
  p.srcs[0] = data;
  p.dsts[0] = data;
  p.scales[0] = factor;
  p.scaled = scaled ? 1 : 0;
  p.divided = divided;
  p.divisor = divisor;
  dispatch_reduce(op, device, t, p, s);
}

}  // namespace

void scale(const char* op, int device, dtype t, void* data, std::size_t n, double factor,
           stream_t s) {
  in_place(op, "scale", device, t, data, n, true, factor, false, 0.0, s);
}

void divide(const char* op, int device, dtype t, void* data, std::size_t n, double divisor,
            stream_t s) {
  in_place(op, "divide", device, t, data, n, false, 1.0, true, divisor, s);
}

namespace {

template <dtype From, dtype To>
void launch_cast(const char* op, int device, const void* src, void* dst, std::size_t n,
                 stream_t s) {
  constexpr std::size_t sf = sizeof(typename elem_of<From>::storage);
  constexpr std::size_t st = sizeof(typename elem_of<To>::storage);
  // The first head (< 8) after which both pointers are 16-byte aligned, if any.
  std::size_t head = n, nvec = 0;
  for (std::size_t h = 0; h < 8 && h < n; ++h) {
    if ((address(src) + h * sf) % 16 == 0 && (address(dst) + h * st) % 16 == 0) {
      head = h;
      nvec = (n - h) / 8;
      break;
    }
  }
  const std::size_t steps = (nvec + unroll - 1) / unroll + (n - nvec * 8);
  cast_kernel<From, To>
      <<<grid_for(op, device, steps), threads, 0, native(s)>>>(src, dst, n, head, nvec);
  check_launch(op, device, "cast_kernel");
}

}  // namespace

void cast(const char* op, int device, dtype from, const void* src, dtype to, void* dst,
          std::size_t n, stream_t s) {
  check_dtype(op, from);
  check_dtype(op, to);
  const bool f32_from = from == dtype::float32 && is_half(to);
  const bool f32_to = is_half(from) && to == dtype::float32;
  if (from != to && !f32_from && !f32_to)
    invalid(std::string(op) + ": no cast from " + name(from) + " to " + name(to) +
            " (float32 <-> float16/bfloat16 only)");
  if (n == 0) return;
  check_pointer(op, "source", 0, src, from);
  check_pointer(op, "destination", 0, dst, to);
  if (from == to) {
    void* dsts[] = {dst};
    return copy_into(op, device, element_size(from), src, n, dsts, 1, s);
  }
  if (from == dtype::float32 && to == dtype::float16)
    return launch_cast<dtype::float32, dtype::float16>(op, device, src, dst, n, s);
  if (from == dtype::float32 && to == dtype::bfloat16)
    return launch_cast<dtype::float32, dtype::bfloat16>(op, device, src, dst, n, s);
  if (from == dtype::float16)
    return launch_cast<dtype::float16, dtype::float32>(op, device, src, dst, n, s);
  return launch_cast<dtype::bfloat16, dtype::float32>(op, device, src, dst, n, s);
}

void copy_segments(const char* op, int device, const std::vector<copy_segment>& segments,
                   stream_t s) {
  for (std::size_t k = 0; k < segments.size(); ++k)
    if (segments[k].bytes > 0 && (!segments[k].dst || !segments[k].src))
      invalid(std::string(op) + ": copy segment " + std::to_string(k) + " of " +
              std::to_string(segments[k].bytes) + " bytes has a null pointer");
  const std::size_t max_blocks = std::size_t(sm_count(op, device)) * blocks_per_sm;
  for (std::size_t k = 0; k < segments.size();) {
    segment_params p{};
    unsigned n = 0;
    std::size_t largest = 0;
    for (; k < segments.size() && n < segments_per_launch; ++k) {
      if (segments[k].bytes == 0) continue;
      p.seg[n++] = segments[k];
      largest = std::max(largest, segments[k].bytes);
    }
    if (n == 0) break;
    // Enough blocks for the largest segment, about max_blocks in all.
    const std::size_t per_block = std::size_t(threads) * unroll * 16;
    const std::size_t want = (largest + per_block - 1) / per_block;
    const std::size_t share = std::max<std::size_t>(1, (max_blocks + n - 1) / n);
    const dim3 grid(unsigned(std::clamp<std::size_t>(want, 1, share)), n);
    copy_kernel<<<grid, threads, 0, native(s)>>>(p);
    check_launch(op, device, "copy_kernel");
  }
}

void launch_invalid_for_test(const char* op, int device, stream_t s) {
  // More threads per block than any device has.
  invalid_kernel<<<1, 4096, 0, native(s)>>>();
  check_launch(op, device, "invalid_kernel");
}

}  // namespace troupe::detail::gpu
