#pragma once
// approx: doctest::Approx(x) passes within its epsilon times (1 + the larger
// value), so any two times of microseconds (1e-5 s) compare equal. The cost
// model's tests compare seconds relatively: only the epsilon's share of the
// value.

#include <doctest/doctest.h>

namespace troupe::test {

inline doctest::Approx relative(double x) {
  return doctest::Approx(x).scale(0);
}

}  // namespace troupe::test
