#include "base/recycled.hpp"

namespace troupe::detail {
namespace {

constexpr std::size_t step = 64;     // size classes of 64 bytes
constexpr std::size_t classes = 32;  // up to 2 KiB
constexpr unsigned depth = 4;        // blocks kept per class

// Trivially destructible, so reaching it is one thread-local lookup with no
// guard, and it stays readable until the thread ends; `sweeper` (below)
// empties it at thread exit.
struct shelf {
  void* blocks[classes][depth];
  unsigned char count[classes];
  bool swept_at_exit;  // the thread's sweeper is registered
  bool gone;           // the thread is ending: frees go to operator delete
};
thread_local shelf here{};

struct sweeper {
  ~sweeper() {
    auto& s = here;
    s.gone = true;
    for (std::size_t c = 0; c < classes; ++c) {
      for (unsigned i = 0; i < s.count[c]; ++i) ::operator delete(s.blocks[c][i]);
      s.count[c] = 0;  // what is allocated later at thread exit comes from operator new
    }
  }
};

// Built (and its destructor registered) on the thread's first shelving.
[[gnu::noinline]] void register_sweeper(shelf& s) {
  thread_local sweeper sweep;
  (void)sweep;
  s.swept_at_exit = true;
}

std::size_t class_of(std::size_t bytes) {
  return bytes == 0 ? 0 : (bytes - 1) / step;
}

}  // namespace

void* recycled_allocate(std::size_t bytes) {
  const auto c = class_of(bytes);
  if (c >= classes) return ::operator new(bytes);
  auto& s = here;
  if (s.count[c] != 0) return s.blocks[c][--s.count[c]];
  // The whole class's size: any block of the class serves any request in it.
  return ::operator new((c + 1) * step);
}

void recycled_free(void* p, std::size_t bytes) noexcept {
  if (!p) return;
  const auto c = class_of(bytes);
  auto& s = here;
  if (c < classes && s.count[c] < depth && !s.gone) {
    if (!s.swept_at_exit) register_sweeper(s);
    s.blocks[c][s.count[c]++] = p;
    return;
  }
  ::operator delete(p);
}

}  // namespace troupe::detail
