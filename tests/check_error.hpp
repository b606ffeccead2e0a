#pragma once
// check_error: asserts that a call throws troupe::error with a given code and
// message words — the shape of every error test in the suites.

#include <doctest/doctest.h>

#include <initializer_list>
#include <string>
#include <string_view>

#include "troupe/error.hpp"

namespace troupe::test {

/// Runs `f`, which must throw troupe::error with `code` and every one of `words` in its message.
template <class F>
void check_error(F&& f, errc code, std::initializer_list<std::string_view> words) {
  try {
    f();
    FAIL_CHECK("expected troupe::error (" << to_string(code) << "), nothing was thrown");
  } catch (const error& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(std::string(to_string(e.code())) == to_string(code), what);
    for (auto w : words)
      CHECK_MESSAGE(what.find(w) != std::string::npos, "'" << w << "' not in: " << what);
  }
}

/// Runs `f`, which must throw troupe::error with `code` and exactly `message`.
template <class F>
void check_exact_error(F&& f, errc code, const std::string& message) {
  try {
    f();
    FAIL_CHECK("expected troupe::error: " << message);
  } catch (const error& e) {
    CHECK(e.code() == code);
    CHECK(std::string(e.what()) == message);
  }
}

}  // namespace troupe::test
