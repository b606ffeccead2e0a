// compute_bucket_assignment_by_size: the four ComputeBucketAssignmentTest
// cases of c10d with their exact buckets and per-bucket limits, and the rules
// around them (sparse gradients, explicit indices, devices, bad arguments).

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "check_error.hpp"
#include "troupe/bucket_assignment.hpp"
#include "troupe/error.hpp"

using namespace troupe;
using troupe::test::check_error;
using buckets_t = std::vector<std::vector<std::size_t>>;
using limits_t = std::vector<std::size_t>;

namespace {

tensor floats(std::int64_t n) {
  return tensor::empty({n}, dtype::float32);
}
tensor doubles(std::int64_t n) {
  return tensor::empty({n}, dtype::float64);
}

}  // namespace

TEST_CASE("single limit, single dtype (c10d test_single_limit_single_dtype)") {
  auto r =
      compute_bucket_assignment_by_size({floats(100), floats(200), floats(100), floats(50)}, {400});
  CHECK(r.buckets == buckets_t{{0}, {1}, {2}, {3}});
  CHECK(r.size_limits == limits_t{400, 400, 400, 400});
}

TEST_CASE("single limit, multiple dtypes (c10d test_single_limit_multi_dtype)") {
  auto r = compute_bucket_assignment_by_size(
      {floats(50), doubles(25), floats(50), doubles(25), floats(50), doubles(25)}, {400});
  CHECK(r.buckets == buckets_t{{0, 2}, {1, 3}, {4}, {5}});
  CHECK(r.size_limits == limits_t{400, 400, 400, 400});
}

TEST_CASE("multiple limits, single dtype (c10d test_multi_limit_single_dtype)") {
  auto r =
      compute_bucket_assignment_by_size({floats(10), floats(10), floats(10), floats(10)}, {40, 80});
  CHECK(r.buckets == buckets_t{{0}, {1, 2}, {3}});
  CHECK(r.size_limits == limits_t{40, 80, 80});
}

TEST_CASE("multiple limits, multiple dtypes (c10d test_multi_limit_multi_dtype)") {
  auto r = compute_bucket_assignment_by_size(
      {floats(50), doubles(25), floats(50), doubles(25), floats(50), doubles(25)}, {200, 400});
  CHECK(r.buckets == buckets_t{{0}, {1}, {2, 4}, {3, 5}});
  CHECK(r.size_limits == limits_t{200, 200, 400, 400});
}

TEST_CASE("a tensor larger than the limit closes its bucket alone; the last limit repeats") {
  auto r = compute_bucket_assignment_by_size({floats(1000), floats(1), floats(1), floats(1000)},
                                             {8, 100});
  // 4000 B >= 8 closes [0]; then 4 + 4 + 4000 >= 100 closes [1, 2, 3].
  CHECK(r.buckets == buckets_t{{0}, {1, 2, 3}});
  CHECK(r.size_limits == limits_t{8, 100});
}

TEST_CASE("expected sparse gradients get buckets of their own with limit 0") {
  auto r = compute_bucket_assignment_by_size({floats(10), floats(10), floats(10), floats(10)},
                                             {1000}, {false, true, false, false});
  CHECK(r.buckets == buckets_t{{0, 2, 3}, {1}});
  CHECK(r.size_limits == limits_t{1000, 0});
}

TEST_CASE("explicit tensor indices keep the order of filling (the rebuild order)") {
  // Gradients ready in reverse: tensors[i] has index 3 - i.
  auto r = compute_bucket_assignment_by_size({floats(10), floats(10), floats(10), floats(10)},
                                             {40, 80}, {}, {3, 2, 1, 0});
  CHECK(r.buckets == buckets_t{{3}, {2, 1}, {0}});
  CHECK(r.size_limits == limits_t{40, 80, 80});
  // expect_sparse is indexed by tensor index, not by position.
  auto s = compute_bucket_assignment_by_size({floats(10), floats(10), floats(10)}, {1000},
                                             {true, false, false}, {2, 1, 0});
  CHECK(s.buckets == buckets_t{{0}, {2, 1}});
  CHECK(s.size_limits == limits_t{0, 1000});
}

TEST_CASE("bad arguments name the call and the value") {
  const char* op = "compute_bucket_assignment_by_size";
  check_error([&] { (void)compute_bucket_assignment_by_size({}, {10}); }, errc::invalid_argument,
              {op, "no tensors"});
  check_error([&] { (void)compute_bucket_assignment_by_size({floats(1)}, {}); },
              errc::invalid_argument, {op, "no size limits"});
  check_error([&] { (void)compute_bucket_assignment_by_size({floats(1)}, {0}); },
              errc::invalid_argument, {op, "0 bytes"});
  check_error(
      [&] {
        (void)compute_bucket_assignment_by_size({floats(1)}, {8}, {true, false});
      },
      errc::invalid_argument, {op, "expect_sparse has 2 entries for 1 tensors"});
  check_error(
      [&] {
        (void)compute_bucket_assignment_by_size({floats(1), floats(1)}, {8}, {}, {0, 0});
      },
      errc::invalid_argument, {op, "tensor index 0 appears twice"});
  check_error(
      [&] {
        (void)compute_bucket_assignment_by_size({floats(1), floats(1)}, {8}, {}, {0, 5});
      },
      errc::invalid_argument, {op, "tensor index 5 out of range"});
  check_error([&] { (void)compute_bucket_assignment_by_size({tensor{}}, {8}); },
              errc::invalid_argument, {op, "tensor 0 is undefined"});
}
