#pragma once
/// at::Tensor <-> troupe::tensor without a copy, through DLPack both ways.
///
/// Both directions share the memory: writes through one are seen through the
/// other, and each keeps the memory alive for as long as it lives. Every
/// dtype both sides have converts (bool, uint8, int8, int16, int32, int64,
/// float16, bfloat16, float32, float64, complex64, complex128), on the CPU
/// and on CUDA devices. A tensor troupe cannot take (a sparse, quantized or
/// complex32 tensor, a device other than cpu and cuda, an undefined tensor)
/// is errc::invalid_argument naming what it is.

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "troupe/tensor.hpp"

namespace troupe_torch {

/// The troupe dtype of a torch scalar type; errc::invalid_argument naming
/// `what` and the type when troupe has no such dtype.
troupe::dtype to_troupe_dtype(c10::ScalarType t, const std::string& what = "tensor");
/// The torch scalar type of a troupe dtype.
c10::ScalarType to_torch_dtype(troupe::dtype t);

/// `t` as a troupe tensor over the same memory (strides kept: a
/// non-contiguous tensor converts, and collectives then refuse it).
troupe::tensor to_troupe(const at::Tensor& t);
/// `t` as an at::Tensor over the same memory.
at::Tensor to_torch(const troupe::tensor& t);

/// For arguments of collectives: as to_troupe, but a non-contiguous tensor is
/// errc::invalid_argument "OP: WHAT is not contiguous (shape [...], strides
/// [...]); call .contiguous() first", WHAT naming the argument ("tensor 1",
/// "output 0 of input 2").
troupe::tensor to_troupe_dense(const at::Tensor& t, const char* op, const std::string& what);
/// Every tensor of `ts`, as to_troupe_dense, named "WHAT i".
troupe::tensor_list to_troupe_dense(const std::vector<at::Tensor>& ts, const char* op,
                                    const std::string& what);

}  // namespace troupe_torch
