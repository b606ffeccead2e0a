#pragma once
// troupe's own CUDA kernels (cuda/kernels.cu), callable without CUDA headers.
//
// Every kernel runs on the given stream and returns once it was launched;
// launch errors throw troupe::error(errc::backend) naming the call, the device
// and CUDA's error string (see cuda/runtime.hpp). The element-wise rules are
// those of the CPU kernels (kernels/reduce_kernels.hpp): integer SUM/PRODUCT wrap
// around, floating MIN/MAX propagate NaN, float16 and bfloat16 accumulate in
// float32 and round once, bool SUM/MAX/BOR = or, PRODUCT/MIN/BAND = and.

#include <cstddef>
#include <vector>

#include "cuda/runtime.hpp"
#include "troupe/dtype.hpp"
#include "troupe/reduce_op.hpp"

namespace troupe::detail::gpu {

/// An element-wise reduction of several buffers into one or more buffers:
/// for every i, v = op over j of (srcs[j][i] * scales[j]); v /= divisor;
/// then dsts[k][i] = v for every k. Sources and destinations may be the same
/// buffers (an in-place allreduce writes into its sources): each element is
/// read from every source before it is written anywhere.
struct reduce_args {
  dtype type = dtype::float32;
  /// SUM, PRODUCT, MIN, MAX, BAND, BOR or BXOR (AVG is SUM with a divisor,
  /// PREMUL_SUM is SUM with scales).
  reduce_op::kind op = reduce_op::SUM;
  std::size_t count = 0;  ///< elements
  std::vector<const void*> srcs;
  /// One factor per source (PREMUL_SUM), or empty for none. Floating and complex only.
  std::vector<double> scales;
  std::vector<void*> dsts;
  /// AVG: the result is divided by this (0: no division). Floating and complex only.
  double divisor = 0.0;
};

/// Launches the reduction described by `a` (any number of sources and
/// destinations; more than a launch takes are done in several launches).
/// `op_name` names the troupe call for errors.
void reduce(const char* op_name, int device, const reduce_args& a, stream_t s);

/// data[i] *= factor (PREMUL_SUM scaling; floating and complex dtypes).
void scale(const char* op_name, int device, dtype t, void* data, std::size_t n, double factor,
           stream_t s);
/// data[i] /= divisor (AVG; floating and complex dtypes).
void divide(const char* op_name, int device, dtype t, void* data, std::size_t n, double divisor,
            stream_t s);

/// dst[i] = (to) src[i] for float32 <-> float16 and float32 <-> bfloat16
/// (round to nearest even; NaN stays NaN), or a copy when from == to.
void cast(const char* op_name, int device, dtype from, const void* src, dtype to, void* dst,
          std::size_t n, stream_t s);

/// One contiguous piece of a pack or unpack.
struct copy_segment {
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
};
/// Copies every segment (packing many tensors into one buffer, or unpacking
/// one buffer into many) in as few launches as the kernel's parameters allow.
void copy_segments(const char* op_name, int device, const std::vector<copy_segment>& segments,
                   stream_t s);

/// Launches a kernel with an invalid configuration, so that tests can see a
/// launch error become a failed work (never used outside tests).
void launch_invalid_for_test(const char* op_name, int device, stream_t s);

}  // namespace troupe::detail::gpu
