// The seeded mutation loop: runs a fuzzing target (fuzz/fuzz_target.hpp)
// without libFuzzer, so that every build (g++ included) fuzzes. Inputs are
// the target's seeds mutated by a pseudo-random generator with a fixed seed:
// bit flips, interesting integers written over 1, 2, 4 or 8 bytes (0, 1, -1,
// 0x7f..., 0x80..., 2^62), bytes inserted, removed or duplicated, seeds
// spliced. The same seed gives the same inputs, so a failure reproduces.
//
//   fuzz_<target>_mutate [--iterations N] [--seconds S] [--seed X]
//                        [--write-seeds DIR]
// Runs N inputs (default 20000) or for S seconds, whichever comes first
// when both are given; prints how many it ran. --write-seeds writes the
// seeds as files (a corpus for libFuzzer) and exits.

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "fuzz/fuzz_target.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

std::string mutate(std::string s, const std::vector<std::string>& seeds, std::mt19937_64& gen) {
  auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(gen() % n); };
  const int rounds = 1 + static_cast<int>(gen() % 4);
  for (int i = 0; i < rounds; ++i) {
    switch (gen() % 7) {
      case 0:  // flip a bit
        if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1u << (gen() % 8));
        break;
      case 1: {  // an interesting integer over 1, 2, 4 or 8 bytes
        static const std::uint64_t values[] = {0,
                                               1,
                                               ~std::uint64_t{0},
                                               0x7f,
                                               0x80,
                                               0xff,
                                               0x7fff,
                                               0xffff,
                                               0x7fffffff,
                                               0x80000000,
                                               0xffffffff,
                                               std::uint64_t{1} << 62,
                                               std::uint64_t{1} << 40};
        const std::size_t width = std::size_t{1} << (gen() % 4);
        if (s.size() < width) break;
        const auto v = values[pick(std::size(values))];
        std::memcpy(s.data() + pick(s.size() - width + 1), &v, width);
        break;
      }
      case 2:  // a random byte
        if (!s.empty()) s[pick(s.size())] = static_cast<char>(gen());
        break;
      case 3: {  // insert random bytes
        std::string junk(1 + pick(16), '\0');
        for (auto& c : junk) c = static_cast<char>(gen());
        s.insert(pick(s.size() + 1), junk);
        break;
      }
      case 4:  // remove a run
        if (!s.empty()) {
          const auto at = pick(s.size());
          s.erase(at, 1 + pick(std::min<std::size_t>(64, s.size() - at)));
        }
        break;
      case 5:  // duplicate a run
        if (!s.empty()) {
          const auto at = pick(s.size());
          s.insert(pick(s.size() + 1), s.substr(at, 1 + pick(64)));
        }
        break;
      case 6: {  // splice another seed in
        const auto& o = seeds[pick(seeds.size())];
        if (!o.empty()) s = s.substr(0, pick(s.size() + 1)) + o.substr(pick(o.size()));
        break;
      }
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  long long iterations = -1, seconds = -1;
  std::uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--iterations") {
      iterations = std::atoll(argv[i + 1]);
    } else if (flag == "--seconds") {
      seconds = std::atoll(argv[i + 1]);
    } else if (flag == "--seed") {
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (flag == "--write-seeds") {
      int k = 0;
      for (const auto& s : troupe::fuzz::seeds())
        std::ofstream(std::string(argv[i + 1]) + "/seed-" + std::to_string(k++), std::ios::binary)
            << s;
      return 0;
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (iterations < 0 && seconds < 0) iterations = 20000;
  const auto seeds = troupe::fuzz::seeds();
  std::mt19937_64 gen(seed);
  const auto start = clock_type::now();
  const auto until =
      seconds < 0 ? clock_type::time_point::max() : start + std::chrono::seconds(seconds);
  long long ran = 0;
  std::uint64_t bytes = 0;
  for (const auto& s : seeds) {  // every seed as it is, first
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
    ++ran;
  }
  while ((iterations < 0 || ran < iterations) && clock_type::now() < until) {
    auto input = seeds[static_cast<std::size_t>(gen() % seeds.size())];
    input = mutate(std::move(input), seeds, gen);
    bytes += input.size();
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
    ++ran;
  }
  const auto took = std::chrono::duration<double>(clock_type::now() - start).count();
  std::printf("fuzz %s: %lld inputs (%llu bytes) from seed %llu in %.1f s, no invariant broken\n",
              troupe::fuzz::name(), ran, static_cast<unsigned long long>(bytes),
              static_cast<unsigned long long>(seed), took);
  return 0;
}
