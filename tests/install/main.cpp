// install_main — builds against an installed troupe (find_package(troupe)),
// checks that the headers' version is the library's, and runs a 2-rank
// allreduce.
#include <troupe/testing.hpp>
#include <troupe/troupe.hpp>

#include <cstdio>
#include <cstring>

int main() {
  if (std::strcmp(troupe::library_version(), TROUPE_VERSION) != 0) {
    std::fprintf(stderr, "install_main FAILED: headers say %s, the library %s\n", TROUPE_VERSION,
                 troupe::library_version());
    return 1;
  }
  try {
    troupe::testing::run_ranks(2, [](troupe::world& w) {
      auto t = troupe::tensor::from_vector<float>({1.0f + w.rank(), 10.0f});
      w.default_group().allreduce(t).wait();
      if (t.to_vector<float>() != std::vector<float>{3.0f, 20.0f})
        throw troupe::error(troupe::errc::internal, "wrong allreduce result");
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "install_main FAILED: %s\n", e.what());
    return 1;
  }
  std::printf("install_main: 2-rank allreduce through the installed troupe is correct\n");
  return 0;
}
