// DLPack import and export: zero copy both ways, every dtype, strides and
// byte offsets, devices, and ownership on errors.

#include <dlpack/dlpack.h>
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "check_error.hpp"
#include "troupe/error.hpp"
#include "troupe/tensor.hpp"

using namespace troupe;
using troupe::test::check_exact_error;

namespace {

const dtype all_dtypes[] = {dtype::bool_,   dtype::uint8,   dtype::int8,      dtype::int16,
                            dtype::int32,   dtype::int64,   dtype::float16,   dtype::bfloat16,
                            dtype::float32, dtype::float64, dtype::complex64, dtype::complex128};

}  // namespace

namespace {

// A hand-made DLManagedTensor over a heap buffer; counts deleter calls.
struct fake_dl {
  std::vector<std::uint8_t> memory;
  std::vector<std::int64_t> shape, strides;
  int* deleted;
  DLManagedTensor managed{};
};

DLManagedTensor* make_fake(std::size_t bytes, std::vector<std::int64_t> shape,
                           std::vector<std::int64_t> strides, DLDataType t, int* deleted,
                           std::uint64_t byte_offset = 0, DLDevice dev = {kDLCPU, 0}) {
  auto* f =
      new fake_dl{std::vector<std::uint8_t>(bytes), std::move(shape), std::move(strides), deleted};
  auto& m = f->managed;
  m.dl_tensor.data = f->memory.data();
  m.dl_tensor.device = dev;
  m.dl_tensor.ndim = static_cast<int>(f->shape.size());
  m.dl_tensor.dtype = t;
  m.dl_tensor.shape = f->shape.data();
  m.dl_tensor.strides = f->strides.empty() ? nullptr : f->strides.data();
  m.dl_tensor.byte_offset = byte_offset;
  m.manager_ctx = f;
  m.deleter = [](DLManagedTensor* self) {
    auto* ctx = static_cast<fake_dl*>(self->manager_ctx);
    ++*ctx->deleted;
    delete ctx;
  };
  return &m;
}

}  // namespace

TEST_CASE("DLPack export/import round trip for every dtype, zero copy") {
  const DLDataType expected[] = {{6, 8, 1},         {kDLUInt, 8, 1},     {kDLInt, 8, 1},
                                 {kDLInt, 16, 1},   {kDLInt, 32, 1},     {kDLInt, 64, 1},
                                 {kDLFloat, 16, 1}, {kDLBfloat, 16, 1},  {kDLFloat, 32, 1},
                                 {kDLFloat, 64, 1}, {kDLComplex, 64, 1}, {kDLComplex, 128, 1}};
  for (int i = 0; i < dtype_count; ++i) {
    const dtype t = all_dtypes[i];
    CAPTURE(to_string(t));
    auto original = tensor::zeros({3, 4}, t);
    std::memset(original.data(), 1, original.nbytes());
    DLManagedTensor* m = original.to_dlpack();
    CHECK(m->dl_tensor.data == original.data());
    CHECK(m->dl_tensor.ndim == 2);
    CHECK(m->dl_tensor.shape[0] == 3);
    CHECK(m->dl_tensor.shape[1] == 4);
    CHECK(m->dl_tensor.strides[0] == 4);
    CHECK(m->dl_tensor.strides[1] == 1);
    CHECK(m->dl_tensor.byte_offset == 0);
    CHECK(m->dl_tensor.device.device_type == kDLCPU);
    CHECK(m->dl_tensor.dtype.code == expected[i].code);
    CHECK(m->dl_tensor.dtype.bits == expected[i].bits);
    CHECK(m->dl_tensor.dtype.lanes == 1);

    void* address = original.data();
    original = tensor();  // the export alone keeps the memory alive
    auto back = tensor::from_dlpack(m);
    CHECK(back.data() == address);
    CHECK(back.scalar_type() == t);
    CHECK(back.shape() == shape_t{3, 4});
    CHECK(back.strides() == shape_t{4, 1});
    CHECK(back.is_cpu());
    CHECK(static_cast<const std::uint8_t*>(back.data())[back.nbytes() - 1] == 1);
  }
}

TEST_CASE("DLPack export of views, scalars and devices") {
  auto t = tensor::from_vector<double>({0, 1, 2, 3, 4, 5});
  auto slice = t.flat_slice(2, 4).view({2, 2});
  DLManagedTensor* m = slice.to_dlpack();
  CHECK(m->dl_tensor.data == slice.data());
  auto back = tensor::from_dlpack(m);
  CHECK(back.to_vector<double>() == std::vector<double>{2, 3, 4, 5});

  auto scalar = t.flat_slice(1, 1).view({});
  auto* ms = scalar.to_dlpack();
  CHECK(ms->dl_tensor.ndim == 0);
  auto sback = tensor::from_dlpack(ms);
  CHECK(sback.dim() == 0);
  CHECK(sback.numel() == 1);
  CHECK(sback.to_vector<double>() == std::vector<double>{1});

  float buf[4] = {};
  auto dev = tensor::from_blob(buf, {4}, dtype::float32, device::cuda(2));
  auto* md = dev.to_dlpack();
  CHECK(md->dl_tensor.device.device_type == kDLCUDA);
  CHECK(md->dl_tensor.device.device_id == 2);
  auto dback = tensor::from_dlpack(md);
  CHECK(dback.get_device() == device::cuda(2));
  CHECK(dback.data() == buf);

  // A consumer that never imports just calls the deleter.
  auto* unused = t.to_dlpack();
  unused->deleter(unused);
}

TEST_CASE("DLPack import of a hand-made tensor with strides and byte_offset") {
  int deleted = 0;
  {
    // 2x3 int32 column-major, starting 8 bytes into the buffer.
    DLManagedTensor* m = make_fake(8 + 6 * 4, {2, 3}, {1, 2}, {kDLInt, 32, 1}, &deleted, 8);
    auto* base = static_cast<std::uint8_t*>(m->dl_tensor.data);
    std::int32_t values[6] = {0, 1, 2, 3, 4, 5};
    std::memcpy(base + 8, values, sizeof values);
    auto t = tensor::from_dlpack(m);
    CHECK(t.data() == base + 8);
    CHECK(t.shape() == shape_t{2, 3});
    CHECK(t.strides() == shape_t{1, 2});
    CHECK_FALSE(t.is_contiguous());
    CHECK(t.clone().to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 2, 4, 1, 3, 5});
    auto copy = t;
    t = tensor();
    CHECK(deleted == 0);
    auto exported = copy.to_dlpack();  // re-export chains the ownership
    copy = tensor();
    CHECK(deleted == 0);
    exported->deleter(exported);
  }
  CHECK(deleted == 1);

  // NULL strides means contiguous.
  DLManagedTensor* m = make_fake(24, {2, 3}, {}, {kDLFloat, 32, 1}, &deleted);
  {
    auto t = tensor::from_dlpack(m);
    CHECK(t.strides() == shape_t{3, 1});
    CHECK(t.is_contiguous());
  }
  CHECK(deleted == 2);

  // Pinned host memory is cpu; bool is code 6 bits 8; CUDA keeps the index.
  m = make_fake(4, {4}, {}, {6, 8, 1}, &deleted, 0, {kDLCUDAHost, 0});
  auto b = tensor::from_dlpack(m);
  CHECK(b.scalar_type() == dtype::bool_);
  CHECK(b.is_cpu());
  b = tensor();
  m = make_fake(4, {2}, {}, {kDLBfloat, 16, 1}, &deleted, 0, {kDLCUDA, 3});
  auto c = tensor::from_dlpack(m);
  CHECK(c.get_device() == device::cuda(3));
  CHECK(c.scalar_type() == dtype::bfloat16);
  c = tensor();
  CHECK(deleted == 4);

  // A deleter may be NULL.
  float buf[2] = {};
  DLManagedTensor raw{};
  std::int64_t shape[1] = {2};
  raw.dl_tensor.data = buf;
  raw.dl_tensor.device = {kDLCPU, 0};
  raw.dl_tensor.ndim = 1;
  raw.dl_tensor.dtype = {kDLFloat, 32, 1};
  raw.dl_tensor.shape = shape;
  CHECK(tensor::from_dlpack(&raw).data() == buf);
}

TEST_CASE("DLPack import errors leave ownership with the caller") {
  int deleted = 0;
  const struct {
    DLDataType type;
    const char* message;
  } bad_types[] = {
      {{kDLFloat, 32, 4}, "tensor.from_dlpack: unsupported DLPack dtype code 2 bits 32 lanes 4"},
      {{kDLUInt, 16, 1}, "tensor.from_dlpack: unsupported DLPack dtype code 1 bits 16 lanes 1"},
      {{kDLInt, 128, 1}, "tensor.from_dlpack: unsupported DLPack dtype code 0 bits 128 lanes 1"},
      {{kDLFloat, 8, 1}, "tensor.from_dlpack: unsupported DLPack dtype code 2 bits 8 lanes 1"},
      {{kDLOpaqueHandle, 64, 1},
       "tensor.from_dlpack: unsupported DLPack dtype code 3 bits 64 lanes 1"},
      {{6, 1, 1}, "tensor.from_dlpack: unsupported DLPack dtype code 6 bits 1 lanes 1"},
      {{kDLBfloat, 32, 1}, "tensor.from_dlpack: unsupported DLPack dtype code 4 bits 32 lanes 1"},
      {{kDLComplex, 32, 1}, "tensor.from_dlpack: unsupported DLPack dtype code 5 bits 32 lanes 1"},
      {{9, 8, 1}, "tensor.from_dlpack: unsupported DLPack dtype code 9 bits 8 lanes 1"},
  };
  for (const auto& bad : bad_types) {
    DLManagedTensor* m = make_fake(64, {2}, {}, bad.type, &deleted);
    check_exact_error([&] { tensor::from_dlpack(m); }, errc::invalid_argument, bad.message);
    CHECK(deleted == 0);
    m->deleter(m);
    CHECK(deleted == 1);
    deleted = 0;
  }
  DLManagedTensor* m = make_fake(64, {2}, {}, {kDLFloat, 32, 1}, &deleted, 0, {kDLOpenCL, 1});
  check_exact_error([&] { tensor::from_dlpack(m); }, errc::invalid_argument,
                    "tensor.from_dlpack: unsupported DLPack device type 4 (id 1)");
  m->deleter(m);
  m = make_fake(64, {2, -1}, {}, {kDLFloat, 32, 1}, &deleted);
  check_exact_error([&] { tensor::from_dlpack(m); }, errc::invalid_argument,
                    "tensor.from_dlpack: negative dimension -1 in shape [2, -1]");
  m->deleter(m);
  CHECK(deleted == 2);
  check_exact_error([] { tensor::from_dlpack(nullptr); }, errc::invalid_argument,
                    "tensor.from_dlpack: null DLManagedTensor");
}
