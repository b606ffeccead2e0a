// The dtype checks of every call that has them, each with its text: tensors
// of one call that must share a dtype (and the calls that take a dtype per
// tensor, or complex tensors with real ones), and reduce ops a dtype does
// not support. A refused call issues nothing.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "check_error.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using troupe::test::check_error;

namespace {

tensor f32(std::int64_t n = 2) {
  return tensor::zeros({n}, dtype::float32);
}
tensor i64(std::int64_t n = 2) {
  return tensor::zeros({n}, dtype::int64);
}

}  // namespace

TEST_CASE("calls whose tensors share a dtype refuse another, naming both") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    const int me = w.rank();
    auto refuse = [](const std::string& op, auto&& call, const std::string& first,
                     const std::string& second) {
      CAPTURE(op);
      check_error(call, errc::invalid_argument,
                  {op + ": tensors with different dtypes: " + first + " and " + second});
    };
    refuse(
        "broadcast",
        [&] {
          pg.broadcast(tensor_list{f32(), i64()});
        },
        "float32", "int64");
    refuse(
        "allreduce",
        [&] {
          pg.allreduce(tensor_list{f32(), i64()});
        },
        "float32", "int64");
    refuse(
        "reduce",
        [&] {
          pg.reduce(tensor_list{i64(), f32()});
        },
        "int64", "float32");
    refuse(
        "allgather",
        [&] {
          pg.allgather(tensor_list{i64(), i64()}, f32());
        },
        "float32", "int64");
    refuse(
        "allgather_into_tensor", [&] { pg.allgather_into_tensor(i64(4), f32()); }, "float32",
        "int64");
    // The rooted calls check the root's list (the others pass none).
    if (me == 0) {
      refuse(
          "gather",
          [&] {
            pg.gather(tensor_list{i64(), i64()}, f32(), {.root_rank = 0});
          },
          "float32", "int64");
      refuse(
          "scatter",
          [&] {
            pg.scatter(f32(), tensor_list{i64(), i64()}, {.root_rank = 0});
          },
          "float32", "int64");
      refuse(
          "gatherv",
          [&] {
            pg.gatherv(i64(4), f32(), {2, 2});
          },
          "float32", "int64");
      refuse(
          "scatterv",
          [&] {
            pg.scatterv(f32(), i64(4), {2, 2});
          },
          "int64", "float32");
    }
    refuse(
        "reduce_scatter",
        [&] {
          pg.reduce_scatter(f32(), tensor_list{f32(), i64()});
        },
        "float32", "int64");
    refuse(
        "reduce_scatter_tensor", [&] { pg.reduce_scatter_tensor(f32(), i64(4)); }, "int64",
        "float32");
    refuse(
        "alltoall_single", [&] { pg.alltoall_single(i64(), f32()); }, "float32", "int64");
    refuse(
        "alltoall",
        [&] {
          pg.alltoall(tensor_list{f32(), i64()}, tensor_list{f32(), f32()});
        },
        "float32", "int64");
    refuse(
        "allgatherv",
        [&] {
          pg.allgatherv(i64(4), f32(), {2, 2});
        },
        "float32", "int64");
    refuse(
        "reduce_scatterv",
        [&] {
          pg.reduce_scatterv(i64(), f32(4), {2, 2});
        },
        "float32", "int64");
    // A dtype per tensor where c10d takes one, or complex with its element type.
    check_error(
        [&] {
          pg.allreduce_coalesced({f32(), i64()});
        },
        errc::invalid_argument,
        {"allreduce_coalesced: tensors with different dtypes: float32 and int64 (a complex "
         "tensor mixes only with its element type: complex64 with float32, complex128 "
         "with float64)"});
    check_error(
        [&] {
          pg.reduce_scatter_tensor_coalesced({f32(), i64()}, {f32(4), i64(4)});
        },
        errc::invalid_argument,
        {"reduce_scatter_tensor_coalesced: tensors with different dtypes: float32 and int64"});
    check_error(
        [&] {
          pg.reduce_scatter_tensor_coalesced({f32(), f32()},
                                             {f32(4), tensor::zeros({4}, dtype::complex64)});
        },
        errc::invalid_argument,
        {"reduce_scatter_tensor_coalesced: outputs[1] is float32 but inputs[1] is complex64"});
    check_error(
        [&] {
          pg.allgather_coalesced({{f32(), i64()}, {f32(), f32()}}, {f32(), i64()});
        },
        errc::invalid_argument,
        {"allgather_coalesced: output_tensor_lists[1][1] is float32 but input_tensors[1] is "
         "int64"});
    check_error(
        [&] {
          pg.allgather_into_tensor_coalesced({i64(4), f32(4)}, {f32(), i64()});
        },
        errc::invalid_argument,
        {"allgather_into_tensor_coalesced: outputs[0] is int64 but inputs[0] is float32"});
    CHECK(pg.sequence_number() == 0);
  });
}

TEST_CASE("reducing calls refuse a reduce op their dtype does not support") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    auto refuse = [](const std::string& op, auto&& call, const std::string& what) {
      CAPTURE(op);
      check_error(call, errc::invalid_argument, {op + ": ReduceOp " + what});
    };
    refuse(
        "allreduce", [&] { pg.allreduce(i64(), reduce_op::AVG); },
        "AVG is not supported for dtype int64");
    refuse(
        "allreduce", [&] { pg.allreduce(f32(), reduce_op::BXOR); },
        "BXOR is not supported for dtype float32");
    refuse(
        "allreduce_coalesced",
        [&] {
          pg.allreduce_coalesced({i64(), i64(3)}, {.op = reduce_op::AVG});
        },
        "AVG is not supported for dtype int64");
    refuse(
        "reduce", [&] { pg.reduce(tensor::zeros({1}, dtype::complex64), 0, reduce_op::MAX); },
        "MAX is not supported for dtype complex64");
    refuse(
        "reduce_scatter",
        [&] {
          pg.reduce_scatter(
              tensor::zeros({1}, dtype::bool_),
              tensor_list{tensor::zeros({1}, dtype::bool_), tensor::zeros({1}, dtype::bool_)},
              {.op = reduce_op::premul_sum(2.0)});
        },
        "PREMUL_SUM is not supported for dtype bool");
    refuse(
        "reduce_scatter_tensor",
        [&] { pg.reduce_scatter_tensor(f32(), f32(4), {.op = reduce_op::BAND}); },
        "BAND is not supported for dtype float32");
    refuse(
        "reduce_scatter_tensor_coalesced",
        [&] { pg.reduce_scatter_tensor_coalesced({i64()}, {i64(4)}, {.op = reduce_op::AVG}); },
        "AVG is not supported for dtype int64");
    refuse(
        "reduce_scatterv",
        [&] {
          pg.reduce_scatterv(tensor::zeros({2}, dtype::complex128),
                             tensor::zeros({4}, dtype::complex128), {2, 2}, {.op = reduce_op::MIN});
        },
        "MIN is not supported for dtype complex128");
    CHECK(pg.sequence_number() == 0);
  });
}
