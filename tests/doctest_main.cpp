// The main of the suites. With TROUPE_TEST_DEVICE=cuda (the gpu-labelled runs
// of the collective suites) and no usable CUDA device it prints why and exits
// with 77, which ctest reports as skipped.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "troupe/device.hpp"

int main(int argc, char** argv) {
  const char* dev = std::getenv("TROUPE_TEST_DEVICE");
  if (dev && std::string(dev) == "cuda" && !troupe::cuda_available()) {
    std::printf("skipped: TROUPE_TEST_DEVICE=cuda but no usable CUDA device (%s)\n",
                troupe::cuda_status().c_str());
    return 77;
  }
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  return ctx.run();
}
