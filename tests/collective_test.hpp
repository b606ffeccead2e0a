#pragma once
// Shared pieces of the collective suites: rank counts, seeds, dtype lists.

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "reference.hpp"
#include "troupe/testing.hpp"

namespace ct {

inline const int rank_counts[] = {1, 2, 3, 4, 7};

/// A seed that differs per rank, group size, length and call site.
inline std::uint64_t seed(int rank, int n, std::int64_t len, int salt) {
  return static_cast<std::uint64_t>(rank * 1000003 + n * 1009 + len * 31 + salt);
}

/// Representative dtypes for the data-movement collectives.
inline const troupe::dtype move_dtypes[] = {troupe::dtype::float32,   troupe::dtype::int64,
                                            troupe::dtype::uint8,     troupe::dtype::bfloat16,
                                            troupe::dtype::complex64, troupe::dtype::bool_};

/// Every rank's random values of `len` elements.
inline std::vector<ref::values> per_rank(troupe::dtype t, int n, std::int64_t len, int salt) {
  std::vector<ref::values> r;
  for (int i = 0; i < n; ++i) r.push_back(ref::random_values(t, len, seed(i, n, len, salt)));
  return r;
}

/// The reduce ops troupe takes for dtype `t` (PREMUL_SUM with scale 0.5).
inline std::vector<troupe::reduce_op> ops_for(troupe::dtype t) {
  using troupe::reduce_op;
  std::vector<reduce_op> all{reduce_op::SUM, reduce_op::AVG,  reduce_op::PRODUCT,
                             reduce_op::MIN, reduce_op::MAX,  reduce_op::BAND,
                             reduce_op::BOR, reduce_op::BXOR, reduce_op::premul_sum(0.5)};
  std::vector<reduce_op> ok;
  for (auto& op : all) {
    try {
      troupe::check_reduce_supported("test", op, t);
      ok.push_back(op);
    } catch (const troupe::error&) {
    }
  }
  return ok;
}

/// Every rank's input and their reduction, for one call.
struct expected_call {
  std::shared_ptr<const std::vector<ref::values>> inputs;
  ref::values result;
  const ref::values& input(int rank) const { return (*inputs)[static_cast<std::size_t>(rank)]; }
};

/// The inputs (ref::random_values of `t` for `op`, seeded by `salt`) and
/// reference of one allreduce of n ranks, made once per process for all its
/// ranks: each rank thread making them again multiplied a suite's time by
/// up to 7. The ranks call in the same order and hold what they use, so only
/// the last one made is kept; calls that differ only in the op (other than
/// PRODUCT, whose inputs differ) share the inputs.
inline std::shared_ptr<const expected_call> expected_for(troupe::dtype t,
                                                         const troupe::reduce_op& op, int n,
                                                         std::int64_t len, int salt) {
  static std::mutex mtx;
  static std::string last_key, last_inputs_key;
  static std::shared_ptr<const expected_call> last;
  static std::shared_ptr<const std::vector<ref::values>> last_inputs;
  const bool product = op.op() == troupe::reduce_op::PRODUCT;
  const auto inputs_key = std::string(troupe::to_string(t)) + " " + std::to_string(n) + " " +
                          std::to_string(len) + " " + std::to_string(salt) + (product ? " *" : "");
  const auto key = op.to_string() + " " + inputs_key;
  std::lock_guard<std::mutex> g{mtx};
  if (key != last_key) {
    last.reset();  // one at a time in memory (a rank still checking holds its own)
    if (inputs_key != last_inputs_key) {
      last_inputs.reset();
      auto in = std::make_shared<std::vector<ref::values>>();
      for (int r = 0; r < n; ++r)
        in->push_back(ref::random_values(t, len, seed(r, n, len, salt), op.op()));
      last_inputs = std::move(in);
      last_inputs_key = inputs_key;
    }
    auto e = std::make_shared<expected_call>();
    e->inputs = last_inputs;
    e->result = ref::reduce(*last_inputs, op, t);
    last = std::move(e);
    last_key = key;
  }
  return last;
}

/// Uneven counts for n ranks, with zeros: 0, 3, 1, 4, 0, 2, 5 ...
inline std::vector<std::int64_t> uneven_counts(int n) {
  static const std::int64_t pattern[] = {0, 3, 1, 4, 0, 2, 5};
  std::vector<std::int64_t> c;
  for (int i = 0; i < n; ++i) c.push_back(pattern[i % 7] + (n == 1 ? 2 : 0));
  return c;
}

inline std::string name(const char* op, troupe::dtype t, std::int64_t len) {
  return std::string(op) + " " + std::string(troupe::to_string(t)) + " len=" + std::to_string(len);
}

}  // namespace ct
