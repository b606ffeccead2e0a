// Tests for reduce_op: equality, serialisation and the dtype rules
// (the kernels are in test_reduce_kernels.cpp).

#include <doctest/doctest.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "check_error.hpp"
#include "troupe/error.hpp"
#include "troupe/reduce_op.hpp"

using namespace troupe;
using troupe::test::check_exact_error;
using kind = reduce_op::kind;

namespace {

const kind all_kinds[] = {reduce_op::SUM, reduce_op::AVG,  reduce_op::PRODUCT,
                          reduce_op::MIN, reduce_op::MAX,  reduce_op::BAND,
                          reduce_op::BOR, reduce_op::BXOR, reduce_op::PREMUL_SUM};

// A reduce_op of kind `k` (PREMUL_SUM with scale 2).
reduce_op make_op(kind k) {
  return k == reduce_op::PREMUL_SUM ? reduce_op::premul_sum(2.0) : k;
}

}  // namespace

TEST_CASE("reduce_op basics and names") {
  const char* names[] = {"SUM",  "AVG", "PRODUCT", "MIN",       "MAX",
                         "BAND", "BOR", "BXOR",    "PREMUL_SUM"};
  for (int i = 0; i < 9; ++i) CHECK(std::string(to_string(all_kinds[i])) == names[i]);
  reduce_op def;
  CHECK(def.op() == reduce_op::SUM);
  CHECK(def.scale() == 1.0);
  CHECK_FALSE(def.has_tensor_scale());
  reduce_op m = reduce_op::MAX;
  CHECK(m.op() == reduce_op::MAX);
  CHECK(m.to_string() == "MAX");
  CHECK(m == reduce_op::MAX);
  CHECK_FALSE(m == reduce_op::MIN);
  CHECK(reduce_op::premul_sum(0.5).to_string() == "PREMUL_SUM(0.5)");
  CHECK(reduce_op::premul_sum(0.1).to_string() == "PREMUL_SUM(0.1)");
  CHECK(reduce_op::premul_sum(3).to_string() == "PREMUL_SUM(3)");
  CHECK(reduce_op::premul_sum(tensor::from_vector<float>({0.25f})).to_string() ==
        "PREMUL_SUM(0.25)");
  CHECK_FALSE(reduce_op::premul_sum(0.5) == reduce_op::PREMUL_SUM);
  check_exact_error([] { reduce_op op(reduce_op::PREMUL_SUM); }, errc::invalid_argument,
                    "reduce_op: PREMUL_SUM needs a scale: use reduce_op::premul_sum(scale)");
  check_exact_error([] { reduce_op op(static_cast<kind>(42)); }, errc::invalid_argument,
                    "reduce_op: unknown kind 42");
}

TEST_CASE("reduce_op equality and copies") {
  CHECK(reduce_op::premul_sum(0.5) == reduce_op::premul_sum(0.5));
  CHECK_FALSE(reduce_op::premul_sum(0.5) == reduce_op::premul_sum(0.25));
  CHECK_FALSE(reduce_op::premul_sum(1.0) == reduce_op(reduce_op::SUM));
  CHECK_FALSE(reduce_op(reduce_op::SUM) == reduce_op::premul_sum(1.0));
  CHECK(reduce_op(reduce_op::AVG) == reduce_op(reduce_op::AVG));
  CHECK_FALSE(reduce_op(reduce_op::AVG) == reduce_op(reduce_op::SUM));

  auto scale = tensor::from_vector<float>({0.5f});
  auto by_tensor = reduce_op::premul_sum(scale);
  CHECK(by_tensor.has_tensor_scale());
  CHECK(by_tensor.scale() == 0.5);
  CHECK(by_tensor == reduce_op::premul_sum(0.5));
  CHECK(reduce_op::premul_sum(0.5) == by_tensor);
  CHECK_FALSE(by_tensor == reduce_op::premul_sum(0.25));
  CHECK(by_tensor == reduce_op::premul_sum(tensor::from_vector<double>({0.5})));

  // The scale tensor is read when used; copies share it.
  auto copy = by_tensor;
  scale.data_as<float>()[0] = 0.25f;
  CHECK(by_tensor.scale() == 0.25);
  CHECK(copy.scale() == 0.25);
  CHECK(copy == reduce_op::premul_sum(0.25));

  reduce_op assigned;
  assigned = reduce_op::premul_sum(4.0);
  CHECK(assigned.scale() == 4.0);
  CHECK(assigned == reduce_op::premul_sum(4.0));

  float16_t h(0.5f);
  bfloat16_t b(0.75f);
  auto th = tensor::empty({1}, dtype::float16);
  *th.data_as<float16_t>() = h;
  auto tb = tensor::empty({1, 1}, dtype::bfloat16);
  *tb.data_as<bfloat16_t>() = b;
  CHECK(reduce_op::premul_sum(th).scale() == 0.5);
  CHECK(reduce_op::premul_sum(tb).scale() == 0.75);
  CHECK(reduce_op::premul_sum(tensor::from_vector<double>({2.0}).view({})).scale() == 2.0);
}

TEST_CASE("premul_sum tensor scale errors") {
  check_exact_error(
      [] { reduce_op::premul_sum(tensor::from_vector<std::int64_t>({1})); }, errc::invalid_argument,
      "reduce_op.premul_sum: scale tensor must be float16, bfloat16, float32 or float64, "
      "got int64");
  check_exact_error(
      [] {
        reduce_op::premul_sum(tensor::from_vector<std::complex<float>>({{1, 0}}));
      },
      errc::invalid_argument,
      "reduce_op.premul_sum: scale tensor must be float16, bfloat16, float32 or float64, "
      "got complex64");
  check_exact_error(
      [] {
        reduce_op::premul_sum(tensor::from_vector<float>({1, 2, 3}));
      },
      errc::invalid_argument, "reduce_op.premul_sum: scale tensor must have one element, got 3");
  check_exact_error([] { reduce_op::premul_sum(tensor::empty({0}, dtype::float32)); },
                    errc::invalid_argument,
                    "reduce_op.premul_sum: scale tensor must have one element, got 0");
  float f = 1;
  check_exact_error(
      [&] { reduce_op::premul_sum(tensor::from_blob(&f, {1}, dtype::float32, device::cuda(0))); },
      errc::invalid_argument, "reduce_op.premul_sum: scale tensor must be on cpu, got cuda:0");
  check_exact_error([] { reduce_op::premul_sum(tensor()); }, errc::invalid_argument,
                    "reduce_op.premul_sum: scale tensor is undefined");
}

TEST_CASE("reduce_op serialize round trip") {
  for (kind k : all_kinds) {
    const std::string kname = to_string(k);
    CAPTURE(kname);
    if (k == reduce_op::PREMUL_SUM) continue;
    reduce_op op = k;
    auto bytes = op.serialize();
    CHECK(bytes == std::vector<std::uint8_t>{static_cast<std::uint8_t>(k), 0});
    auto back = reduce_op::deserialize(bytes);
    CHECK(back == op);
    CHECK(back.op() == k);
  }
  for (double s : {0.5, -3.25, 1e-300, 0.0, std::numeric_limits<double>::infinity()}) {
    auto op = reduce_op::premul_sum(s);
    auto bytes = op.serialize();
    CHECK(bytes.size() == 10);
    CHECK(bytes[0] == reduce_op::PREMUL_SUM);
    auto back = reduce_op::deserialize(bytes);
    CHECK(back == op);
    CHECK(back.scale() == s);
    CHECK_FALSE(back.has_tensor_scale());
  }
  auto op = reduce_op::premul_sum(tensor::from_vector<float>({0.125f}));
  auto back = reduce_op::deserialize(op.serialize());
  CHECK(back == op);
  CHECK(back.has_tensor_scale());
  CHECK(back.scale() == 0.125);
  CHECK(back.serialize() == op.serialize());
  CHECK_FALSE(reduce_op::deserialize(reduce_op::premul_sum(0.5).serialize()) ==
              reduce_op::premul_sum(0.25));
}

TEST_CASE("reduce_op deserialize rejects bad bytes") {
  using bytes = std::vector<std::uint8_t>;
  const char* p = "reduce_op.deserialize: ";
  const auto bad = [&](const bytes& b, const std::string& message) {
    check_exact_error([&] { reduce_op::deserialize(b); }, errc::invalid_argument, p + message);
  };
  bad({}, "need at least 2 bytes, got 0");
  bad({0}, "need at least 2 bytes, got 1");
  bad({9, 0}, "bad kind byte 9");
  bad({255, 0}, "bad kind byte 255");
  bad({0, 3}, "bad scale kind byte 3");
  bad({0, 1}, "SUM takes no scale, got 2 bytes with scale kind 1");
  bad({4, 0, 0}, "MAX takes no scale, got 3 bytes with scale kind 0");
  bad({8, 0}, "PREMUL_SUM needs scale kind 1 or 2 and 10 bytes, got scale kind 0 and 2 bytes");
  bad({8, 1, 0, 0, 0},
      "PREMUL_SUM needs scale kind 1 or 2 and 10 bytes, got scale kind 1 and 5 bytes");
  auto ok = reduce_op::premul_sum(0.5).serialize();
  ok.push_back(0);
  bad(ok, "PREMUL_SUM needs scale kind 1 or 2 and 10 bytes, got scale kind 1 and 11 bytes");
}

TEST_CASE("check_reduce_supported for every (op, dtype)") {
  // Rows: kinds in enum order; columns: dtypes in enum order
  // (bool uint8 int8 int16 int32 int64 f16 bf16 f32 f64 c64 c128).
  const char* table[] = {
      "111111111111",  // SUM
      "000000111111",  // AVG
      "111111111111",  // PRODUCT
      "111111111100",  // MIN
      "111111111100",  // MAX
      "111111000000",  // BAND
      "111111000000",  // BOR
      "111111000000",  // BXOR
      "000000111111",  // PREMUL_SUM
  };
  int allowed = 0;
  for (int ki = 0; ki < 9; ++ki) {
    for (int ti = 0; ti < dtype_count; ++ti) {
      const kind k = all_kinds[ki];
      const auto t = static_cast<dtype>(ti);
      const std::string kname = to_string(k);
      CAPTURE(kname);
      CAPTURE(to_string(t));
      const bool expected = table[ki][ti] == '1';
      CHECK(is_reduce_supported(k, t) == expected);
      if (expected) {
        ++allowed;
        CHECK_NOTHROW(check_reduce_supported("allreduce", make_op(k), t));
      } else {
        check_exact_error([&] { check_reduce_supported("allreduce", make_op(k), t); },
                          errc::invalid_argument,
                          std::string("allreduce: ReduceOp ") + to_string(k) +
                              " is not supported for dtype " + std::string(to_string(t)));
      }
    }
  }
  CHECK(allowed == 12 + 6 + 12 + 10 + 10 + 18 + 6);
  check_exact_error([] { check_reduce_supported("reduce", reduce_op::BAND, dtype::float32); },
                    errc::invalid_argument,
                    "reduce: ReduceOp BAND is not supported for dtype float32");
}

// --- kernels --------------------------------------------------------------------
