// How dtypes, reduce_ops and errors map onto NCCL (see backends/nccl_plan.hpp).

#include "backends/nccl_plan.hpp"

#include <cstring>

namespace troupe::detail::nccl {

error nccl_error(const char* op, int device, const std::string& call, ncclResult_t r) {
  const char* last = ncclGetLastError(nullptr);
  return error(errc::backend, std::string(op) + ": cuda:" + std::to_string(device) + ": " + call +
                                  " failed: " + ncclGetErrorString(r) + " (" +
                                  (last && *last ? last : "no details") + ")");
}

void refuse(const char* op, const std::string& why) {
  throw error(errc::invalid_argument, std::string(op) + ": " + why);
}

wire wire_of(const char* op, dtype t) {
  switch (t) {
    case dtype::bool_:
    case dtype::uint8:
      return {ncclUint8, 1};
    case dtype::int8:
      return {ncclInt8, 1};
    case dtype::int32:
      return {ncclInt32, 1};
    case dtype::int64:
      return {ncclInt64, 1};
    case dtype::float16:
      return {ncclFloat16, 1};
    case dtype::bfloat16:
      return {ncclBfloat16, 1};
    case dtype::float32:
      return {ncclFloat32, 1};
    case dtype::float64:
      return {ncclFloat64, 1};
    case dtype::complex64:
      return {ncclFloat32, 2};
    case dtype::complex128:
      return {ncclFloat64, 2};
    case dtype::int16:
      break;
  }
  refuse(op, "Input tensor data type is not supported for NCCL process group: " +
                 std::string(to_string(t)));
}

void check_types(const char* op, const tensor_list& ts) {
  for (auto& t : ts)
    if (t.defined()) wire_of(op, t.scalar_type());
}

reduction reduction_of(const char* op, const reduce_op& r, dtype t) {
  const auto k = r.op();
  const std::string name = std::string("ReduceOp.") + to_string(k);
  if (k == reduce_op::BAND || k == reduce_op::BOR || k == reduce_op::BXOR)
    refuse(op, "Cannot use " + name + " with NCCL");
  if (is_complex(t) && (k == reduce_op::PRODUCT || k == reduce_op::MIN || k == reduce_op::MAX))
    refuse(op, name + " is not supported on complex tensors (" + std::string(to_string(t)) +
                   ") with NCCL");
  if (!is_floating_point(t) && !is_complex(t) &&
      (k == reduce_op::AVG || k == reduce_op::PREMUL_SUM))
    refuse(op, "Cannot use " + name + " with " + std::string(to_string(t)) + " inputs");
  const bool boolean = t == dtype::bool_;  // uint8 on the wire: or = max, and = min
  switch (k) {
    case reduce_op::SUM:
      return {boolean ? ncclMax : ncclSum};
    case reduce_op::PRODUCT:
      return {boolean ? ncclMin : ncclProd};
    case reduce_op::MIN:
      return {ncclMin};
    case reduce_op::MAX:
      return {ncclMax};
    case reduce_op::AVG:
      return {ncclAvg};
    case reduce_op::PREMUL_SUM:
      return {ncclSum, true, r.scale()};
    default:
      break;
  }
  refuse(op, "Unhandled " + name);
}

scalar scalar_of(double v, ncclDataType_t type) {
  scalar s;
  auto put = [&](auto x) { std::memcpy(s.bytes, &x, sizeof x); };
  if (type == ncclFloat16) put(float16_t(static_cast<float>(v)).bits);
  if (type == ncclBfloat16) put(bfloat16_t(static_cast<float>(v)).bits);
  if (type == ncclFloat32) put(static_cast<float>(v));
  if (type == ncclFloat64) put(v);
  return s;
}

}  // namespace troupe::detail::nccl
