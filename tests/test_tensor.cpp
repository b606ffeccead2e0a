// Tests for dtypes, float16/bfloat16 conversions and tensors (DLPack: test_dlpack.cpp).

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "../backends/flat_buffers.hpp"
#include "../base/tensor_util.hpp"
#include "check_error.hpp"
#include "troupe/error.hpp"
#include "troupe/tensor.hpp"

using namespace troupe;
using troupe::test::check_error;
using troupe::test::check_exact_error;

namespace {

std::uint16_t half_bits(float f) {
  return float16_t(f).bits;
}
std::uint16_t bf16_bits(float f) {
  return bfloat16_t(f).bits;
}
float from_half(std::uint16_t b) {
  float16_t h;
  h.bits = b;
  return static_cast<float>(h);
}
float from_bf16(std::uint16_t b) {
  bfloat16_t h;
  h.bits = b;
  return static_cast<float>(h);
}

dtype all_dtypes[] = {dtype::bool_,   dtype::uint8,   dtype::int8,      dtype::int16,
                      dtype::int32,   dtype::int64,   dtype::float16,   dtype::bfloat16,
                      dtype::float32, dtype::float64, dtype::complex64, dtype::complex128};

}  // namespace

TEST_CASE("dtype sizes, names and categories") {
  const std::size_t sizes[] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8, 8, 16};
  const char* names[] = {"bool",    "uint8",    "int8",    "int16",   "int32",     "int64",
                         "float16", "bfloat16", "float32", "float64", "complex64", "complex128"};
  static_assert(sizeof(all_dtypes) / sizeof(all_dtypes[0]) == dtype_count);
  for (int i = 0; i < dtype_count; ++i) {
    CAPTURE(i);
    CHECK(element_size(all_dtypes[i]) == sizes[i]);
    CHECK(to_string(all_dtypes[i]) == names[i]);
    CHECK(static_cast<int>(all_dtypes[i]) == i);
  }
  CHECK(is_integral(dtype::uint8));
  CHECK(is_integral(dtype::int64));
  CHECK_FALSE(is_integral(dtype::bool_));
  CHECK_FALSE(is_integral(dtype::float32));
  CHECK(is_floating_point(dtype::float16));
  CHECK(is_floating_point(dtype::bfloat16));
  CHECK(is_floating_point(dtype::float64));
  CHECK_FALSE(is_floating_point(dtype::complex64));
  CHECK_FALSE(is_floating_point(dtype::int32));
  CHECK(is_complex(dtype::complex64));
  CHECK(is_complex(dtype::complex128));
  CHECK_FALSE(is_complex(dtype::float64));
  CHECK(dtype_of<std::complex<double>> == dtype::complex128);
  CHECK(dtype_of<bfloat16_t> == dtype::bfloat16);
}

TEST_CASE("device names") {
  CHECK(to_string(device::cpu()) == "cpu");
  CHECK(to_string(device::cuda(0)) == "cuda:0");
  CHECK(to_string(device::cuda(3)) == "cuda:3");
  CHECK(std::string(to_string(device_type::cuda)) == "cuda");
  CHECK(device::cuda(1) == device::cuda(1));
  CHECK_FALSE(device::cuda(1) == device::cuda(2));
}

TEST_CASE("float16 conversion from float") {
  CHECK(half_bits(0.0f) == 0x0000);
  CHECK(half_bits(-0.0f) == 0x8000);
  CHECK(half_bits(1.0f) == 0x3c00);
  CHECK(half_bits(-2.0f) == 0xc000);
  CHECK(half_bits(0.5f) == 0x3800);
  CHECK(half_bits(0.1f) == 0x2e66);
  CHECK(half_bits(1.0f / 3.0f) == 0x3555);
  CHECK(half_bits(65504.0f) == 0x7bff);  // largest finite
  CHECK(half_bits(65519.0f) == 0x7bff);  // just below the rounding boundary
  CHECK(half_bits(65520.0f) == 0x7c00);  // halfway to 2^16: rounds to even = Inf
  CHECK(half_bits(1e6f) == 0x7c00);
  CHECK(half_bits(-1e6f) == 0xfc00);
  CHECK(half_bits(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(half_bits(-std::numeric_limits<float>::infinity()) == 0xfc00);
  const auto nan = half_bits(std::numeric_limits<float>::quiet_NaN());
  CHECK((nan & 0x7c00) == 0x7c00);
  CHECK((nan & 0x03ff) != 0);
  // Round to nearest even at the 10-bit mantissa boundary.
  CHECK(half_bits(1.0f + 0x1p-11f) == 0x3c00);             // tie, even stays
  CHECK(half_bits(1.0f + 3 * 0x1p-11f) == 0x3c02);         // tie, odd rounds up
  CHECK(half_bits(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);  // above the tie
  // Normals and subnormals.
  CHECK(half_bits(0x1p-14f) == 0x0400);             // smallest normal
  CHECK(half_bits(0x1p-24f) == 0x0001);             // smallest subnormal
  CHECK(half_bits(1023 * 0x1p-24f) == 0x03ff);      // largest subnormal
  CHECK(half_bits(0x1p-25f) == 0x0000);             // tie to even (zero)
  CHECK(half_bits(3 * 0x1p-25f) == 0x0002);         // tie to even (two)
  CHECK(half_bits(0x1p-25f + 0x1p-35f) == 0x0001);  // above the tie
  CHECK(half_bits(-0x1p-24f) == 0x8001);
  CHECK(half_bits(1e-10f) == 0x0000);
  CHECK(half_bits(2047 * 0x1p-25f) == 0x0400);  // rounds up into the normals
}

TEST_CASE("float16 conversion to float") {
  CHECK(from_half(0x3c00) == 1.0f);
  CHECK(from_half(0xc000) == -2.0f);
  CHECK(from_half(0x7bff) == 65504.0f);
  CHECK(from_half(0x3555) == 0.333251953125f);
  CHECK(from_half(0x0001) == 0x1p-24f);
  CHECK(from_half(0x03ff) == 1023 * 0x1p-24f);
  CHECK(from_half(0x0400) == 0x1p-14f);
  CHECK(from_half(0x8001) == -0x1p-24f);
  CHECK(std::bit_cast<std::uint32_t>(from_half(0x8000)) == 0x80000000u);
  CHECK(from_half(0x7c00) == std::numeric_limits<float>::infinity());
  CHECK(from_half(0xfc00) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(from_half(0x7e00)));
  CHECK(std::isnan(from_half(0x7c01)));  // signalling payload stays NaN
  // Every finite half survives a round trip through float.
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    if ((b & 0x7c00) == 0x7c00) continue;
    if (half_bits(from_half(static_cast<std::uint16_t>(b))) != b) {
      CHECK(half_bits(from_half(static_cast<std::uint16_t>(b))) == b);
      break;
    }
  }
}

TEST_CASE("bfloat16 conversions") {
  CHECK(bf16_bits(1.0f) == 0x3f80);
  CHECK(bf16_bits(-2.0f) == 0xc000);
  CHECK(bf16_bits(3.14159265f) == 0x4049);
  CHECK(bf16_bits(1.0f + 0x1p-8f) == 0x3f80);      // tie, even stays
  CHECK(bf16_bits(1.0f + 3 * 0x1p-8f) == 0x3f82);  // tie, odd rounds up
  CHECK(bf16_bits(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);
  CHECK(bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);  // rounds to Inf
  CHECK(bf16_bits(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(bf16_bits(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(bf16_bits(0x1p-130f) == 0x0008);  // float subnormal stays subnormal
  CHECK(from_bf16(0x0008) == 0x1p-130f);
  CHECK(bf16_bits(-0.0f) == 0x8000);
  const auto nan = bf16_bits(std::numeric_limits<float>::quiet_NaN());
  CHECK((nan & 0x7f80) == 0x7f80);
  CHECK((nan & 0x007f) != 0);
  // A NaN whose payload lies only in the low bits must not become Inf.
  const auto low_nan = bf16_bits(std::bit_cast<float>(0x7f800001u));
  CHECK((low_nan & 0x7f80) == 0x7f80);
  CHECK((low_nan & 0x007f) != 0);
  CHECK(from_bf16(0x3f80) == 1.0f);
  CHECK(from_bf16(0x4049) == 3.140625f);
  CHECK(from_bf16(0xff80) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(from_bf16(0x7fc0)));
}

TEST_CASE("small host buffers: 64-byte aligned, whole, freed on any thread") {
  // Sizes around the recycled size classes (64-byte steps up to 2 KiB),
  // past them, and up to the pooled mappings (64 KiB).
  std::vector<tensor> kept;
  for (std::int64_t n : {0, 1, 15, 16, 17, 100, 496, 497, 512, 1000, 2048, 4096, 16383}) {
    for (int round = 0; round < 3; ++round) {  // shelved blocks come back
      auto t = tensor::empty({n}, dtype::float32);
      CAPTURE(n);
      CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % 64 == 0);
      CHECK(t.shape() == shape_t{n});
      CHECK(t.strides() == shape_t{1});
      CHECK(t.is_contiguous());
      // Every byte is the tensor's own: writing them all is seen back.
      auto* b = static_cast<unsigned char*>(t.data());
      for (std::size_t i = 0; i < t.nbytes(); ++i) b[i] = static_cast<unsigned char>(i * 7 + n);
      kept.push_back(t);
    }
  }
  // Another thread frees them (its own shelves take some), then this one
  // allocates again: no block is handed out twice while alive.
  std::thread([moved = std::move(kept)]() mutable { moved.clear(); }).join();
  auto a = tensor::empty({7}, dtype::int64), b = tensor::empty({7}, dtype::int64);
  CHECK(a.data() != b.data());
  auto c = tensor::empty({3, 5}, dtype::float64);  // two dimensions: a layout of its own
  CHECK(c.strides() == shape_t{5, 1});
  CHECK(reinterpret_cast<std::uintptr_t>(c.data()) % 64 == 0);
}

TEST_CASE("empty, zeros: shape, strides, contiguity, alignment") {
  auto t = tensor::empty({2, 3, 4}, dtype::float32);
  CHECK(t.defined());
  CHECK(t.is_cpu());
  CHECK(t.scalar_type() == dtype::float32);
  CHECK(t.shape() == shape_t{2, 3, 4});
  CHECK(t.strides() == shape_t{12, 4, 1});
  CHECK(t.dim() == 3);
  CHECK(t.numel() == 24);
  CHECK(t.element_size() == 4);
  CHECK(t.nbytes() == 96);
  CHECK(t.is_contiguous());
  CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % 64 == 0);

  auto z = tensor::zeros({5}, dtype::int64);
  for (auto v : z.to_vector<std::int64_t>()) CHECK(v == 0);

  auto scalar = tensor::zeros({}, dtype::float64);
  CHECK(scalar.numel() == 1);
  CHECK(scalar.dim() == 0);
  CHECK(scalar.nbytes() == 8);
  CHECK(scalar.is_contiguous());
  CHECK(scalar.describe() == "tensor(float64, cpu, [])");

  auto none = tensor::empty({3, 0, 2}, dtype::int8);
  CHECK(none.defined());
  CHECK(none.numel() == 0);
  CHECK(none.nbytes() == 0);
  CHECK(none.is_contiguous());
  CHECK(none.data() != nullptr);

  tensor undefined;
  CHECK_FALSE(undefined.defined());
  CHECK(undefined.numel() == 0);
  CHECK(undefined.data() == nullptr);
  CHECK(undefined.describe() == "tensor(undefined)");

  CHECK(t.describe() == "tensor(float32, cpu, [2, 3, 4])");
  CHECK(tensor::empty({2, 3}, dtype::bool_).describe() == "tensor(bool, cpu, [2, 3])");
}

TEST_CASE(
    "a large tensor moves into shared memory in place on its second use: same address, same "
    "contents") {
  const std::int64_t len = (1 << 20) + 5;  // 4 MiB and a ragged tail
  auto t = tensor::empty({len}, dtype::int32);
  for (std::int64_t i = 0; i < len; ++i) t.data_as<int>()[i] = int(i * 7);
  void* at = t.data();
  CHECK_FALSE(detail::find_shared(at, t.nbytes()));
  CHECK_FALSE(detail::share_in_place(at, t.nbytes()));  // the first use is only counted
  CHECK_FALSE(detail::find_shared(at, t.nbytes()));
  auto r = detail::share_in_place(at, t.nbytes());
  REQUIRE(r);
  CHECK(t.data() == at);
  CHECK(r->offset == 0);
  CHECK(r->size >= t.nbytes());
  bool same = true;
  for (std::int64_t i = 0; i < len; ++i) same &= t.data_as<int>()[i] == int(i * 7);
  CHECK(same);
  // The memory is the memfd's: a second mapping of it sees this one's writes.
  void* other = ::mmap(nullptr, r->size, PROT_READ, MAP_SHARED, r->fd, 0);
  REQUIRE(other != MAP_FAILED);
  t.data_as<int>()[len - 1] = -9;
  CHECK(static_cast<const int*>(other)[len - 1] == -9);
  ::munmap(other, r->size);
  // Found from now on, once only moved; a range inside it is found too.
  auto found = detail::find_shared(t.data_as<int>() + 8, 64);
  REQUIRE(found);
  CHECK(found->id == r->id);
  CHECK(found->offset == 32);
  CHECK_FALSE(detail::share_in_place(at, t.nbytes()));
  // Freed: no longer registered, its descriptor closed.
  const int fd = r->fd;
  t = tensor{};
  CHECK_FALSE(detail::find_shared(at, 64));
  CHECK(::fcntl(fd, F_GETFD) == -1);
}

TEST_CASE("only a whole large allocation of tensor::empty moves into shared memory") {
  auto big = tensor::empty({3 << 20}, dtype::float32);  // 12 MiB
  auto slice = big.flat_slice(1 << 20, 1 << 20);
  CHECK_FALSE(detail::share_in_place(slice.data(), slice.nbytes()));     // a part
  CHECK_FALSE(detail::share_in_place(big.data(), big.nbytes() - 4096));  // not all of it
  auto tiny = tensor::empty({1 << 12}, dtype::float32);  // 16 KiB: not a mapping of its own
  CHECK_FALSE(detail::share_in_place(tiny.data(), tiny.nbytes()));
  CHECK_FALSE(detail::share_in_place(tiny.data(), tiny.nbytes()));
  std::vector<float> own(1 << 20);
  auto borrowed = tensor::from_blob(own.data(), {1 << 20}, dtype::float32);
  CHECK_FALSE(detail::share_in_place(borrowed.data(), borrowed.nbytes()));
  ::setenv("TROUPE_SHARE_IN_PLACE", "off", 1);
  CHECK_FALSE(detail::share_in_place(big.data(), big.nbytes()));
  CHECK_FALSE(detail::share_in_place(big.data(), big.nbytes()));
  ::unsetenv("TROUPE_SHARE_IN_PLACE");
  CHECK_FALSE(detail::share_in_place(big.data(), big.nbytes()));  // the first use counted
  CHECK(detail::share_in_place(big.data(), big.nbytes()));
}

TEST_CASE("a pooled middle-sized buffer moves into shared memory too, and stays so when reused") {
  const std::int64_t len = (1 << 18) - 5;  // just under 1 MiB: the pool's 1 MiB buffers
  void* at = nullptr;
  std::uint64_t id = 0;
  {
    auto t = tensor::empty({len}, dtype::float32);
    for (std::int64_t i = 0; i < len; ++i) t.data_as<float>()[i] = float(i % 101);
    at = t.data();
    CHECK_FALSE(detail::share_in_place(at, t.nbytes()));  // the first use is only counted
    auto r = detail::share_in_place(at, t.nbytes());
    REQUIRE(r);
    id = r->id;
    CHECK(t.data() == at);
    bool same = true;
    for (std::int64_t i = 0; i < len; ++i) same &= t.data_as<float>()[i] == float(i % 101);
    CHECK(same);
  }
  // Freed into the pool and handed out again: still the same shared memory.
  auto u = tensor::empty({1 << 17}, dtype::float32);  // 512 KiB: another size class
  auto v = tensor::empty({len}, dtype::float32);
  CHECK(v.data() == at);
  auto found = detail::find_shared(v.data(), v.nbytes());
  REQUIRE(found);
  CHECK(found->id == id);
  CHECK_FALSE(detail::find_shared(u.data(), u.nbytes()));
}

TEST_CASE("a child forked after a pooled buffer was shared in place never gets that buffer") {
  const std::int64_t len = 1 << 16;  // 256 KiB: the pool's 256 KiB buffers
  void* at = nullptr;
  {
    auto t = tensor::empty({len}, dtype::int32);
    for (std::int64_t i = 0; i < len; ++i) t.data_as<int>()[i] = 7;
    at = t.data();
    (void)detail::share_in_place(at, t.nbytes());
    REQUIRE(detail::share_in_place(at, t.nbytes()));
  }  // back in the pool, still shared memory
  const pid_t child = ::fork();
  if (child == 0) {
    // The same size class: a private buffer (perhaps at the same address,
    // mapped afresh), written freely.
    auto c = tensor::empty({len}, dtype::int32);
    const bool fine = !detail::find_shared(c.data(), 64) && !detail::find_shared(at, 64);
    for (std::int64_t i = 0; i < len; ++i) c.data_as<int>()[i] = -1;
    ::_exit(fine ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // The parent still has it, shared, its contents untouched by the child.
  auto t = tensor::empty({len}, dtype::int32);
  CHECK(t.data() == at);
  CHECK(detail::find_shared(at, 64));
  bool same = true;
  for (std::int64_t i = 0; i < len; ++i) same &= t.data_as<int>()[i] == 7;
  CHECK(same);
}

TEST_CASE("at most a quarter of the process's descriptors hold buffers shared in place") {
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  rlimit low = saved;
  low.rlim_cur = 40;  // at most 10 moved allocations
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::vector<tensor> ts;
  int moved = 0;
  bool last = true;
  for (int k = 0; k < 12; ++k) {
    ts.push_back(tensor::empty({1 << 19}, dtype::float32));  // 2 MiB
    auto& t = ts.back();
    (void)detail::share_in_place(t.data(), t.nbytes());
    last = detail::share_in_place(t.data(), t.nbytes()).has_value();
    moved += last;
  }
  ::setrlimit(RLIMIT_NOFILE, &saved);
  CHECK(moved <= 10);
  CHECK(moved >= 8);  // earlier tests may have left a pooled buffer moved
  CHECK_FALSE(last);
  // Freed, they make room again.
  ts.clear();
  auto t = tensor::empty({1 << 19}, dtype::float32);
  (void)detail::share_in_place(t.data(), t.nbytes());
  CHECK(detail::share_in_place(t.data(), t.nbytes()));
}

TEST_CASE("contiguity rules") {
  float buf[64] = {};
  CHECK(tensor::from_blob(buf, {2, 3}, {3, 1}, dtype::float32).is_contiguous());
  CHECK_FALSE(tensor::from_blob(buf, {2, 3}, {1, 2}, dtype::float32).is_contiguous());
  CHECK_FALSE(tensor::from_blob(buf, {2, 3}, {6, 2}, dtype::float32).is_contiguous());
  // Strides of size-1 dimensions do not matter.
  CHECK(tensor::from_blob(buf, {1, 3}, {99, 1}, dtype::float32).is_contiguous());
  CHECK(tensor::from_blob(buf, {2, 1, 3}, {3, 7, 1}, dtype::float32).is_contiguous());
  CHECK(tensor::from_blob(buf, {1}, {5}, dtype::float32).is_contiguous());
  // Zero elements are contiguous whatever the strides.
  CHECK(tensor::from_blob(buf, {2, 0}, {5, 7}, dtype::float32).is_contiguous());
  auto strided = tensor::from_blob(buf, {2, 3}, {1, 2}, dtype::float32);
  CHECK(strided.describe() == "tensor(float32, cpu, [2, 3], strides [1, 2])");
}

TEST_CASE("from_blob borrows") {
  std::vector<std::int32_t> values{1, 2, 3, 4, 5, 6};
  {
    auto t = tensor::from_blob(values.data(), {2, 3}, dtype::int32);
    CHECK(t.data() == values.data());
    CHECK(t.strides() == shape_t{3, 1});
    t.data_as<std::int32_t>()[0] = 42;
    auto copy = t;  // handles share memory
    CHECK(copy.data() == values.data());
  }
  CHECK(values[0] == 42);  // still valid, not freed
  auto empty = tensor::from_blob(nullptr, {0}, dtype::float32);
  CHECK(empty.defined());
  CHECK(empty.numel() == 0);
  auto dev = tensor::from_blob(values.data(), {6}, dtype::int32, device::cuda(1));
  CHECK_FALSE(dev.is_cpu());
  CHECK(dev.get_device() == device::cuda(1));
  CHECK(dev.describe() == "tensor(int32, cuda:1, [6])");
}

TEST_CASE("adopt calls the deleter exactly once") {
  int calls = 0;
  void* seen = nullptr;
  auto* mem = new float[4]{1, 2, 3, 4};
  {
    auto t = tensor::adopt(mem, {4}, dtype::float32, [&](void* p) {
      ++calls;
      seen = p;
      delete[] static_cast<float*>(p);
    });
    CHECK(t.data() == mem);
    auto a = t;
    auto b = t.view({2, 2});
    auto c = t.flat_slice(1, 2);
    t = tensor();
    CHECK(calls == 0);
    CHECK(c.to_vector<float>() == std::vector<float>{2, 3});
  }
  CHECK(calls == 1);
  CHECK(seen == mem);
}

TEST_CASE("flat views of many lengths, made over and over, keep each its own shape") {
  auto t = tensor::zeros({3, 4}, dtype::float32);
  for (int round = 0; round < 3; ++round) {
    std::vector<tensor> views;
    for (std::int64_t n = 0; n <= 12; ++n) {
      views.push_back(t.flat_slice(12 - n, n));
      views.push_back(t.flat_slice(0, n).view({n}));
    }
    views.push_back(t.view({12}));
    views.push_back(t.view({-1}));
    for (std::size_t i = 0; i + 2 < views.size(); ++i) {
      const auto n = static_cast<std::int64_t>(i / 2);
      CHECK(views[i].shape() == shape_t{n});
      CHECK(views[i].strides() == shape_t{1});
      CHECK(views[i].numel() == n);
      CHECK(views[i].is_contiguous());
    }
    CHECK(views[views.size() - 2].shape() == shape_t{12});
    CHECK(views.back().shape() == shape_t{12});
    CHECK(t.shape() == shape_t{3, 4});
    CHECK(t.view({2, 6}).strides() == shape_t{6, 1});
  }
}

TEST_CASE("the library's view over tensors that lie one after another keeps their memory alive") {
  using troupe::detail::adjacent;
  int freed = 0;
  auto* mem = new float[6]{1, 2, 3, 4, 5, 6};
  auto whole = tensor::adopt(mem, {6}, dtype::float32, [&](void* p) {
    ++freed;
    delete[] static_cast<float*>(p);
  });
  SUBCASE("blocks of one tensor") {
    tensor row;
    {
      tensor_list blocks{whole.flat_slice(0, 2), whole.flat_slice(2, 2), whole.flat_slice(4, 2)};
      row = adjacent(blocks);
      whole = tensor();
    }
    REQUIRE(row.defined());
    CHECK(row.data() == mem);
    CHECK(row.shape() == shape_t{6});
    CHECK(freed == 0);
    CHECK(row.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
    row = tensor();
    CHECK(freed == 1);
  }
  SUBCASE("pieces of memory owned apart") {
    int pieces = 0;
    auto count = [&](void*) { ++pieces; };
    tensor row;
    {
      tensor_list parts{tensor::adopt(mem, {3}, dtype::float32, count),
                        tensor::adopt(mem + 3, {3}, dtype::float32, count)};
      row = adjacent(parts);
    }
    REQUIRE(row.defined());
    CHECK(row.data() == mem);
    CHECK(row.numel() == 6);
    CHECK(pieces == 0);  // the view keeps both owners
    row = tensor();
    CHECK(pieces == 2);
  }
  SUBCASE("borrowed pieces") {
    auto row = adjacent({tensor::from_blob(mem, {3}, dtype::float32),
                         tensor::from_blob(mem + 3, {3}, dtype::float32)});
    REQUIRE(row.defined());
    CHECK(row.data() == mem);
    CHECK(row.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  }
  SUBCASE("not one after another, or not alike: none") {
    CHECK_FALSE(adjacent({whole.flat_slice(0, 2), whole.flat_slice(3, 2)}).defined());
    CHECK_FALSE(adjacent({whole.flat_slice(2, 2), whole.flat_slice(0, 2)}).defined());
    CHECK_FALSE(adjacent({whole.flat_slice(0, 2), whole.flat_slice(2, 0)}).defined());
    auto ints = tensor::from_blob(mem + 2, {2}, dtype::int32);
    CHECK_FALSE(adjacent({whole.flat_slice(0, 2), ints}).defined());
    CHECK_FALSE(adjacent(tensor_list{}).defined());
  }
  whole = tensor();
  CHECK(freed == 1);
}

TEST_CASE("clone is independent and contiguous") {
  auto t = tensor::from_vector<float>({1, 2, 3, 4, 5, 6});
  auto c = t.clone();
  CHECK_FALSE(c.is_same(t));
  CHECK(c.data() != t.data());
  c.data_as<float>()[0] = 100;
  CHECK(t.to_vector<float>()[0] == 1);
  CHECK(c.to_vector<float>() == std::vector<float>{100, 2, 3, 4, 5, 6});

  // A column-major 2x3 view of 0..5 clones to row-major order.
  std::int16_t buf[6] = {0, 1, 2, 3, 4, 5};
  auto strided = tensor::from_blob(buf, {2, 3}, {1, 2}, dtype::int16);
  auto rc = strided.clone();
  CHECK(rc.is_contiguous());
  CHECK(rc.shape() == shape_t{2, 3});
  CHECK(rc.to_vector<std::int16_t>() == std::vector<std::int16_t>{0, 2, 4, 1, 3, 5});
  // Broadcast-like zero stride.
  auto bc = tensor::from_blob(buf, {3, 2}, {0, 1}, dtype::int16).clone();
  CHECK(bc.to_vector<std::int16_t>() == std::vector<std::int16_t>{0, 1, 0, 1, 0, 1});
  // Scalar and empty.
  auto s = tensor::from_vector<double>({7.5}).view({});
  CHECK(s.clone().to_vector<double>() == std::vector<double>{7.5});
  CHECK(tensor::empty({0, 3}, dtype::float32).clone().numel() == 0);
}

TEST_CASE("copy_from and zero_") {
  auto a = tensor::from_vector<std::int64_t>({1, 2, 3, 4});
  auto b = tensor::zeros({2, 2}, dtype::int64);
  b.copy_from(a);  // same numel, different shape is fine
  CHECK(b.to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 2, 3, 4});
  b.zero_();
  CHECK(b.to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 0, 0, 0});
  CHECK(a.to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 2, 3, 4});

  float buf[6] = {1, 2, 3, 4, 5, 6};
  tensor::from_blob(buf, {2, 2}, {3, 1}, dtype::float32).zero_();  // strided: only 4 elements
  CHECK(std::vector<float>(buf, buf + 6) == std::vector<float>{0, 0, 3, 0, 0, 6});

  check_exact_error([&] { b.copy_from(tensor::zeros({4}, dtype::float32)); },
                    errc::invalid_argument, "tensor.copy_from: dtype mismatch int64 vs float32");
  check_exact_error([&] { b.copy_from(tensor::zeros({5}, dtype::int64)); }, errc::invalid_argument,
                    "tensor.copy_from: numel mismatch 4 vs 5");
  std::int64_t ibuf[8] = {};
  auto strided = tensor::from_blob(ibuf, {2, 2}, {1, 2}, dtype::int64);
  check_exact_error([&] { b.copy_from(strided); }, errc::invalid_argument,
                    "tensor.copy_from: source tensor(int64, cpu, [2, 2], strides [1, 2]) is not "
                    "contiguous");
  check_exact_error(
      [&] { strided.copy_from(b); }, errc::invalid_argument,
      "tensor.copy_from: destination tensor(int64, cpu, [2, 2], strides [1, 2]) is not "
      "contiguous");
  check_exact_error([&] { tensor().copy_from(b); }, errc::invalid_argument,
                    "tensor.copy_from: undefined tensor");
  check_exact_error([&] { tensor().zero_(); }, errc::invalid_argument,
                    "tensor.zero_: undefined tensor");
}

TEST_CASE("flat_slice and view") {
  auto t = tensor::from_vector<std::int32_t>({0, 1, 2, 3, 4, 5, 6, 7});
  auto s = t.flat_slice(2, 3);
  CHECK(s.shape() == shape_t{3});
  CHECK(s.data() == t.data_as<std::int32_t>() + 2);
  CHECK(s.to_vector<std::int32_t>() == std::vector<std::int32_t>{2, 3, 4});
  s.data_as<std::int32_t>()[0] = 20;  // a view shares memory
  CHECK(t.to_vector<std::int32_t>()[2] == 20);
  CHECK(t.flat_slice(8, 0).numel() == 0);
  CHECK(t.flat_slice(0, 8).is_same(t));
  CHECK_FALSE(t.flat_slice(0, 4).is_same(t));
  CHECK(s.flat_slice(1, 2).to_vector<std::int32_t>() == std::vector<std::int32_t>{3, 4});

  auto v = t.view({2, 4});
  CHECK(v.shape() == shape_t{2, 4});
  CHECK(v.strides() == shape_t{4, 1});
  CHECK(v.data() == t.data());
  CHECK(t.view({2, -1, 2}).shape() == shape_t{2, 2, 2});
  CHECK(t.view({-1}).shape() == shape_t{8});
  CHECK(t.flat_slice(3, 1).view({}).numel() == 1);

  check_exact_error([&] { t.flat_slice(4, 6); }, errc::invalid_argument,
                    "tensor.flat_slice: range [4, 10) outside 8 elements");
  check_exact_error([&] { t.flat_slice(-1, 2); }, errc::invalid_argument,
                    "tensor.flat_slice: range [-1, 1) outside 8 elements");
  check_exact_error([&] { t.flat_slice(9, 0); }, errc::invalid_argument,
                    "tensor.flat_slice: range [9, 9) outside 8 elements");
  check_exact_error(
      [&] {
        t.view({3, 3});
      },
      errc::invalid_argument, "tensor.view: shape [3, 3] has 9 elements, tensor has 8");
  check_exact_error(
      [&] {
        t.view({3, -1});
      },
      errc::invalid_argument, "tensor.view: shape [3, -1] is invalid for 8 elements");
  check_exact_error(
      [&] {
        t.view({-1, -1});
      },
      errc::invalid_argument, "tensor.view: invalid dimension -1 in shape [-1, -1]");
  float buf[6] = {};
  auto strided = tensor::from_blob(buf, {2, 3}, {1, 2}, dtype::float32);
  check_exact_error([&] { strided.view({6}); }, errc::invalid_argument,
                    "tensor.view: tensor(float32, cpu, [2, 3], strides [1, 2]) is not contiguous");
  check_exact_error(
      [&] { strided.flat_slice(0, 1); }, errc::invalid_argument,
      "tensor.flat_slice: tensor(float32, cpu, [2, 3], strides [1, 2]) is not contiguous");
}

TEST_CASE("constructor and accessor errors") {
  check_exact_error(
      [] {
        tensor::empty({2, -3}, dtype::float32);
      },
      errc::invalid_argument, "tensor.empty: negative dimension -3 in shape [2, -3]");
  check_exact_error(
      [] {
        tensor::empty({1LL << 40, 1LL << 40}, dtype::float32);
      },
      errc::invalid_argument,
      "tensor.empty: shape [1099511627776, 1099511627776] has too many elements");
  check_exact_error([] { tensor::from_blob(nullptr, {2}, dtype::float32); }, errc::invalid_argument,
                    "tensor.from_blob: null data pointer for 2 elements");
  float buf[4] = {};
  check_exact_error(
      [&] {
        tensor::from_blob(buf, {2, 2}, {1}, dtype::float32);
      },
      errc::invalid_argument, "tensor.from_blob: strides [1] do not match shape [2, 2]");
  check_exact_error([&] { tensor::adopt(nullptr, {1}, dtype::float32, [](void*) {}); },
                    errc::invalid_argument, "tensor.adopt: null data pointer for 1 elements");
  auto t = tensor::from_vector<float>({1, 2});
  check_exact_error([&] { t.to_vector<double>(); }, errc::invalid_argument,
                    "tensor.to_vector: dtype mismatch float32 vs float64");
  check_exact_error([&] { tensor().clone(); }, errc::invalid_argument,
                    "tensor.clone: undefined tensor");
  check_exact_error([&] { tensor().view({1}); }, errc::invalid_argument,
                    "tensor.view: undefined tensor");
  check_exact_error([&] { tensor().to_dlpack(); }, errc::invalid_argument,
                    "tensor.to_dlpack: undefined tensor");
}

// Why a CUDA device cannot be used here, as tensor calls say it.
static std::string unusable(const std::string& op, const std::string& dev) {
  if (!cuda_built()) return op + ": device " + dev + " needs a CUDA build of troupe";
  return op + ": device " + dev + " is not usable: " + cuda_status();
}

TEST_CASE("CUDA tensors where no device is usable") {
  if (cuda_available()) {
    // A device exists: only an index beyond the last one is refused.
    check_error([] { tensor::empty({2}, dtype::float32, device::cuda(cuda_device_count())); },
                errc::invalid_argument, {"tensor.empty", "does not exist"});
    return;
  }
  CHECK(cuda_device_count() == 0);
  CHECK_FALSE(cuda_status().empty());
  check_exact_error([] { tensor::empty({2}, dtype::float32, device::cuda(0)); }, errc::backend,
                    unusable("tensor.empty", "cuda:0"));
  check_exact_error([] { tensor::zeros({2}, dtype::float32, device::cuda(1)); }, errc::backend,
                    unusable("tensor.zeros", "cuda:1"));
  if (!cuda_built()) {
    // Memory that claims to live on a device cannot be touched without CUDA.
    float buf[4] = {};
    auto dev = tensor::from_blob(buf, {4}, dtype::float32, device::cuda(0));
    check_exact_error([&] { dev.clone(); }, errc::backend,
                      "tensor.empty: device cuda:0 needs a CUDA build of troupe");
    check_exact_error([&] { dev.zero_(); }, errc::backend,
                      "tensor.zero_: device cuda:0 needs a CUDA build of troupe");
    check_exact_error([&] { dev.to_vector<float>(); }, errc::backend,
                      "tensor.to_vector: CUDA memory needs a CUDA build of troupe");
  }
}

TEST_CASE("from_vector and is_same") {
  auto t = tensor::from_vector<std::complex<float>>({{1, 2}, {3, 4}});
  CHECK(t.scalar_type() == dtype::complex64);
  CHECK(t.to_vector<std::complex<float>>()[1] == std::complex<float>(3, 4));
  auto u = t;
  CHECK(u.is_same(t));
  CHECK(t.view({2, 1}).is_same(t));
  CHECK_FALSE(t.is_same(t.clone()));
  CHECK_FALSE(t.is_same(tensor()));
  CHECK(tensor().is_same(tensor()));
}

// --- DLPack -------------------------------------------------------------------

TEST_CASE("bool tensors come from and go to std::vector<bool>") {
  auto t = tensor::from_vector<bool>({true, false, true});
  CHECK(t.scalar_type() == dtype::bool_);
  CHECK(t.numel() == 3);
  CHECK(t.to_vector<bool>() == std::vector<bool>{true, false, true});
  auto u = tensor::from_vector(std::vector<bool>{false, false, true, true});
  CHECK(u.to_vector<bool>() == std::vector<bool>{false, false, true, true});
}
