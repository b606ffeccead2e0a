#pragma once
// recycled — small blocks a thread freed, kept for that thread's next
// allocation of the same size. Every collective and point-to-point call makes
// a work state and (on an inline engine) an operation and frees both when it
// ends; from the thread's own shelf they cost a few instructions instead of a
// trip through malloc and free.

#include <cstddef>
#include <new>

namespace troupe::detail {

/// Memory for `bytes` (aligned as operator new aligns): up to 2 KiB from the
/// calling thread's shelf when it holds a block of that size class, else
/// from the depot's blocks of the class, else from operator new.
void* recycled_allocate(std::size_t bytes);
/// Gives back what recycled_allocate(bytes) returned, on any thread: it goes
/// to this thread's shelf (8 blocks per class); a full shelf first hands its
/// class over to a depot that threads with an empty shelf take from (up to
/// 128 KiB a class), and past that the block goes to operator delete.
void recycled_free(void* p, std::size_t bytes) noexcept;

/// An allocator on the shelves (for std::allocate_shared).
template <class T>
struct recycling_allocator {
  using value_type = T;
  recycling_allocator() = default;
  template <class U>
  recycling_allocator(const recycling_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(recycled_allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { recycled_free(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const recycling_allocator<U>&) const noexcept {
    return true;
  }
};

/// A base whose objects (of any derived type) live on the shelves.
/// Over-aligned types go to the aligned operator new directly.
struct recycled {
  static void* operator new(std::size_t bytes) { return recycled_allocate(bytes); }
  static void operator delete(void* p, std::size_t bytes) noexcept { recycled_free(p, bytes); }
  static void* operator new(std::size_t bytes, std::align_val_t a) {
    return ::operator new(bytes, a);
  }
  static void operator delete(void* p, std::size_t bytes, std::align_val_t a) noexcept {
    ::operator delete(p, bytes, a);
  }
};

}  // namespace troupe::detail
