// How dtypes and reduce ops travel through NCCL (backends/nccl_plan.hpp): pure
// functions, so they are tested everywhere NCCL is installed, with or
// without a GPU. Builds without NCCL compile this file to nothing.

#include <doctest/doctest.h>

#ifdef TROUPE_HAVE_NCCL

#include <cstring>

#include "../backends/nccl_plan.hpp"
#include "check_error.hpp"

using namespace troupe;
using troupe::test::check_error;
namespace nccl = troupe::detail::nccl;

TEST_CASE("nccl wire types: native dtypes, bool as uint8, complex as pairs, int16 refused") {
  struct row {
    dtype t;
    ncclDataType_t type;
    std::size_t lanes;
  };
  const row rows[] = {{dtype::bool_, ncclUint8, 1},       {dtype::uint8, ncclUint8, 1},
                      {dtype::int8, ncclInt8, 1},         {dtype::int32, ncclInt32, 1},
                      {dtype::int64, ncclInt64, 1},       {dtype::float16, ncclFloat16, 1},
                      {dtype::bfloat16, ncclBfloat16, 1}, {dtype::float32, ncclFloat32, 1},
                      {dtype::float64, ncclFloat64, 1},   {dtype::complex64, ncclFloat32, 2},
                      {dtype::complex128, ncclFloat64, 2}};
  for (auto& r : rows) {
    CAPTURE(to_string(r.t));
    auto w = nccl::wire_of("allreduce", r.t);
    CHECK(w.type == r.type);
    CHECK(w.lanes == r.lanes);
  }
  check_error(
      [] { nccl::wire_of("broadcast", dtype::int16); }, errc::invalid_argument,
      {"broadcast: Input tensor data type is not supported for NCCL process group", "int16"});
  auto ok = tensor::zeros({2}, dtype::float32), bad = tensor::zeros({2}, dtype::int16);
  check_error(
      [&] {
        nccl::check_types("allgather", {ok, bad});
      },
      errc::invalid_argument, {"allgather", "int16"});
}

TEST_CASE("nccl reductions: AVG and PREMUL_SUM natively, bool through max/min, refusals") {
  CHECK(nccl::reduction_of("allreduce", reduce_op::SUM, dtype::float32).op == ncclSum);
  CHECK(nccl::reduction_of("allreduce", reduce_op::AVG, dtype::bfloat16).op == ncclAvg);
  CHECK(nccl::reduction_of("allreduce", reduce_op::AVG, dtype::complex64).op == ncclAvg);
  CHECK(nccl::reduction_of("allreduce", reduce_op::PRODUCT, dtype::int32).op == ncclProd);
  CHECK(nccl::reduction_of("allreduce", reduce_op::SUM, dtype::bool_).op == ncclMax);
  CHECK(nccl::reduction_of("allreduce", reduce_op::PRODUCT, dtype::bool_).op == ncclMin);
  auto premul = nccl::reduction_of("reduce", reduce_op::premul_sum(0.25), dtype::float64);
  CHECK(premul.premul);
  CHECK(premul.scale == 0.25);
  for (auto k : {reduce_op::BAND, reduce_op::BOR, reduce_op::BXOR})
    check_error([k] { nccl::reduction_of("allreduce", k, dtype::int64); }, errc::invalid_argument,
                {"allreduce: Cannot use ReduceOp.", "with NCCL"});
  check_error([] { nccl::reduction_of("reduce", reduce_op::MAX, dtype::complex128); },
              errc::invalid_argument, {"reduce: ReduceOp.MAX is not supported on complex tensors"});
  check_error([] { nccl::reduction_of("allreduce", reduce_op::AVG, dtype::int32); },
              errc::invalid_argument, {"Cannot use ReduceOp.AVG with int32 inputs"});
}

TEST_CASE("nccl PREMUL_SUM scalars are one element of the wire type") {
  auto bits = [](const nccl::scalar& s, std::size_t n) {
    std::uint64_t v = 0;
    std::memcpy(&v, s.bytes, n);
    return v;
  };
  CHECK(bits(nccl::scalar_of(0.5, ncclFloat16), 2) == float16_t(0.5f).bits);
  CHECK(bits(nccl::scalar_of(0.5, ncclBfloat16), 2) == bfloat16_t(0.5f).bits);
  float f = 0;
  std::memcpy(&f, nccl::scalar_of(0.125, ncclFloat32).bytes, 4);
  CHECK(f == 0.125f);
  double d = 0;
  std::memcpy(&d, nccl::scalar_of(-3.5, ncclFloat64).bytes, 8);
  CHECK(d == -3.5);
}

TEST_CASE("nccl errors name the call, the device, the NCCL call and NCCL's words") {
  const auto e = nccl::nccl_error("allreduce", 3, "ncclAllReduce", ncclInvalidArgument);
  const std::string what = e.what();
  CHECK(e.code() == errc::backend);
  CHECK(what.find("allreduce: cuda:3: ncclAllReduce failed: ") == 0);
  CHECK(what.find(ncclGetErrorString(ncclInvalidArgument)) != std::string::npos);
}

#endif
