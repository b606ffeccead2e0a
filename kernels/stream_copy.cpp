#include "kernels/stream_copy.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h>
#define TROUPE_HAVE_STREAM_STORES 1
#endif

namespace troupe::detail {

void stream_copy(void* dst, const void* src, std::size_t n) noexcept {
#ifdef TROUPE_HAVE_STREAM_STORES
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  constexpr std::size_t line = 64;
  // Up to the first cache line boundary of the destination, as usual.
  const auto head = std::min(n, (line - reinterpret_cast<std::uintptr_t>(d) % line) % line);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  for (; n >= line; n -= line, d += line, s += line) {
    const auto* from = reinterpret_cast<const __m128i*>(s);
    auto* to = reinterpret_cast<__m128i*>(d);
    const __m128i a = _mm_loadu_si128(from), b = _mm_loadu_si128(from + 1),
                  c = _mm_loadu_si128(from + 2), e = _mm_loadu_si128(from + 3);
    _mm_stream_si128(to, a);
    _mm_stream_si128(to + 1, b);
    _mm_stream_si128(to + 2, c);
    _mm_stream_si128(to + 3, e);
  }
  std::memcpy(d, s, n);
#else
  std::memcpy(dst, src, n);
#endif
}

namespace {
std::atomic<std::size_t> threshold_set{0};
}  // namespace

std::size_t stream_threshold() noexcept {
  const auto t = threshold_set.load(std::memory_order_relaxed);
  return t ? t : last_level_cache_bytes();
}

void set_stream_threshold(std::size_t bytes) noexcept {
  threshold_set.store(bytes, std::memory_order_relaxed);
}

void stream_fence() noexcept {
#ifdef TROUPE_HAVE_STREAM_STORES
  _mm_sfence();
#endif
}

std::size_t last_level_cache_bytes() noexcept {
  static const std::size_t bytes = [] {
    // sysfs first: in virtual machines sysconf may report the host's cache.
    std::size_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 16; ++i) {
      const auto dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
      std::ifstream level_file(dir + "level"), size_file(dir + "size");
      int level = 0;
      std::string size;
      if (!(level_file >> level) || !(size_file >> size) || size.empty()) continue;
      std::size_t value = 0;
      try {
        value = std::stoull(size);
      } catch (...) {
        continue;
      }
      const char unit = size.back();
      value <<= unit == 'K' ? 10 : unit == 'M' ? 20 : unit == 'G' ? 30 : 0;
      if (level > best_level || (level == best_level && value > best)) {
        best_level = level;
        best = value;
      }
    }
    if (best > 0) return best;
    long b = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    b = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (b <= 0) b = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return b > 0 ? static_cast<std::size_t>(b) : std::size_t{32} << 20;
  }();
  return bytes;
}

}  // namespace troupe::detail
