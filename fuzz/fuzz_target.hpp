#pragma once
// What a fuzzing target of troupe offers: libFuzzer's entry point, and the
// seeds the mutation driver (fuzz/mutation_driver.cpp) starts from. A target
// calls std::abort() when an invariant breaks, so that either driver reports
// the input.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace troupe::fuzz {

/// Well-formed inputs to mutate.
std::vector<std::string> seeds();
/// The target's name in reports ("frames").
const char* name();

/// Aborts with `what` on stderr unless `ok`.
void expect(bool ok, const char* what);

}  // namespace troupe::fuzz
