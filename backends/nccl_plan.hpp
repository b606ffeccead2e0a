#pragma once
// What one call of the "nccl" backend issues: a plan (kernels before, one
// NCCL group of collectives and sends/receives, kernels after), built in the
// caller's thread and run by the device actor (backends/nccl_group.hpp), and how
// dtypes and reduce_ops travel through NCCL.
//
// Reductions: SUM, PRODUCT, MIN, MAX, AVG (ncclAvg) and PREMUL_SUM
// (ncclRedOpCreatePreMulSum with a host-immediate scalar, destroyed after
// the launch); BAND, BOR and BXOR are refused as PyTorch does. bool travels as
// uint8 (SUM as MAX, PRODUCT as MIN), complex as pairs of reals (SUM, AVG,
// PREMUL_SUM and data movement only); int16 has no NCCL type.

#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "cuda/kernels.hpp"
#include "troupe/error.hpp"
#include "troupe/options.hpp"
#include "troupe/reduce_op.hpp"
#include "troupe/tensor.hpp"

namespace troupe::detail::nccl {

// -- NCCL types, reductions and errors ---------------------------------------------

using clock = std::chrono::steady_clock;

/// now + t, or never for t == 0; now for an expired (negative) timeout.
inline clock::time_point deadline_after(timeout_t t) {
  if (t.count() < 0) return clock::now();
  return t.count() > 0 ? clock::now() + t : clock::time_point::max();
}

/// "250 ms".
inline std::string in_ms(timeout_t t) {
  return std::to_string(t.count()) + " ms";
}

/// "OP: cuda:N: CALL failed: STRING (LAST ERROR)".
error nccl_error(const char* op, int device, const std::string& call, ncclResult_t r);

/// Throws errc::invalid_argument: "OP: WHY".
[[noreturn]] void refuse(const char* op, const std::string& why);

/// How a dtype travels through NCCL: `lanes` elements of `type` per element.
struct wire {
  ncclDataType_t type = ncclUint8;
  std::size_t lanes = 1;
};

/// `t`'s wire; refuses a dtype without an NCCL type.
wire wire_of(const char* op, dtype t);

/// Refuses any tensor whose dtype has no NCCL type.
void check_types(const char* op, const tensor_list& ts);

/// A reduce_op as NCCL runs it on one dtype.
struct reduction {
  ncclRedOp_t op = ncclSum;
  bool premul = false;  ///< PREMUL_SUM: a scaling op is made for each launch
  double scale = 1.0;
};

/// `r` on dtype `t`; refuses what NCCL (or PyTorch) does not run.
reduction reduction_of(const char* op, const reduce_op& r, dtype t);

/// PREMUL_SUM's factor as NCCL reads it: one element of `type` in host memory.
struct scalar {
  alignas(8) unsigned char bytes[8] = {};
};

scalar scalar_of(double v, ncclDataType_t type);

// -- plans: what a call issues, built in the caller's thread ------------------------

/// One NCCL collective on flat device buffers (counts in elements of `type`).
struct collective {
  enum kind_t { allreduce, broadcast, reduce, allgather, reduce_scatter } kind;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;  ///< per rank for allgather and reduce_scatter
  dtype type = dtype::uint8;
  reduction red;
  int root = 0;
};

/// One ncclSend or ncclRecv; `peer` is a rank of the communicator.
struct transfer {
  bool send = true;
  void* buf = nullptr;
  std::size_t count = 0;
  dtype type = dtype::uint8;
  int peer = 0;
};

/// Everything one call issues on the stream, in this order.
struct plan {
  std::vector<gpu::copy_segment> pack;    ///< inputs into flat buffers
  std::vector<gpu::reduce_args> combine;  ///< several local tensors into one
  std::vector<collective> collectives;    ///< one NCCL group with ...
  std::vector<transfer> transfers;        ///< ... these sends and receives
  std::vector<gpu::copy_segment> unpack;  ///< flat buffers into the outputs
  std::vector<gpu::reduce_args> spread;   ///< one result into several local tensors
  tensor_list keep;                       ///< memory that must outlive the job
};

}  // namespace troupe::detail::nccl
