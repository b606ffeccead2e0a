// The main of the GPU suites: runs doctest when a CUDA device is usable;
// otherwise prints why not and exits with 77 (ctest: skipped).

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "troupe/device.hpp"

int main(int argc, char** argv) {
  if (!troupe::cuda_available()) {
    std::printf("skipped: no usable CUDA device (%s)\n", troupe::cuda_status().c_str());
    return 77;
  }
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  return ctx.run();
}
