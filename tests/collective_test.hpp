#pragma once
// Shared pieces of the collective suites: rank counts, seeds, dtype lists.

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
