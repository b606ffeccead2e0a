// Zero-copy DLPack import and export (DLPack 0.6).

#include <dlpack/dlpack.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/texts.hpp"
#include "tensor_util.hpp"
#include "troupe/error.hpp"
#include "troupe/tensor.hpp"

namespace troupe {
namespace {

// DLPack 0.6 has no bool code; later versions define kDLBool = 6 (bits 8).
constexpr std::uint8_t dl_bool_code = 6;

[[noreturn]] void bad_dtype(DLDataType t) {
  detail::throw_invalid("tensor.from_dlpack",
                        "unsupported DLPack dtype code " + std::to_string(t.code) + " bits " +
                            std::to_string(t.bits) + " lanes " + std::to_string(t.lanes));
}

dtype from_dl_dtype(DLDataType t) {
  if (t.lanes != 1) bad_dtype(t);
  switch (t.code) {
    case kDLInt:
      switch (t.bits) {
        case 8:
          return dtype::int8;
        case 16:
          return dtype::int16;
        case 32:
          return dtype::int32;
        case 64:
          return dtype::int64;
      }
      break;
    case kDLUInt:
      if (t.bits == 8) return dtype::uint8;
      break;
    case kDLFloat:
      switch (t.bits) {
        case 16:
          return dtype::float16;
        case 32:
          return dtype::float32;
        case 64:
          return dtype::float64;
      }
      break;
    case kDLBfloat:
      if (t.bits == 16) return dtype::bfloat16;
      break;
    case kDLComplex:
      if (t.bits == 64) return dtype::complex64;
      if (t.bits == 128) return dtype::complex128;
      break;
    case dl_bool_code:
      if (t.bits == 8) return dtype::bool_;
      break;
  }
  bad_dtype(t);
}

DLDataType to_dl_dtype(dtype t) {
  const auto bits = static_cast<std::uint8_t>(element_size(t) * 8);
  switch (t) {
    case dtype::bool_:
      return {dl_bool_code, 8, 1};
    case dtype::uint8:
      return {kDLUInt, 8, 1};
    case dtype::int8:
    case dtype::int16:
    case dtype::int32:
    case dtype::int64:
      return {kDLInt, bits, 1};
    case dtype::float16:
    case dtype::float32:
    case dtype::float64:
      return {kDLFloat, bits, 1};
    case dtype::bfloat16:
      return {kDLBfloat, 16, 1};
    case dtype::complex64:
    case dtype::complex128:
      return {kDLComplex, bits, 1};
  }
  detail::throw_invalid("tensor.to_dlpack", "unknown dtype");
}

device from_dl_device(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      return device::cpu();
    case kDLCUDA:
    case kDLCUDAManaged:
      return device::cuda(d.device_id);
    default:
      break;
  }
  detail::throw_invalid("tensor.from_dlpack", "unsupported DLPack device type " +
                                                  std::to_string(static_cast<int>(d.device_type)) +
                                                  " (id " + std::to_string(d.device_id) + ")");
}

// Owns everything an exported DLManagedTensor points into.
struct export_context {
  tensor keep_alive;
  shape_t shape;
  shape_t strides;
  DLManagedTensor managed{};
};

}  // namespace

tensor tensor::from_dlpack(DLManagedTensor* managed) {
  // Validate everything before taking ownership: on error the caller still owns `managed`.
  if (!managed) detail::throw_invalid("tensor.from_dlpack", "null DLManagedTensor");
  const DLTensor& dl = managed->dl_tensor;
  if (dl.ndim < 0)
    detail::throw_invalid("tensor.from_dlpack", "negative ndim " + std::to_string(dl.ndim));
  if (dl.ndim > 0 && !dl.shape)
    detail::throw_invalid("tensor.from_dlpack", "null shape for ndim " + std::to_string(dl.ndim));
  const dtype t = from_dl_dtype(dl.dtype);
  const device d = from_dl_device(dl.device);
  shape_t shape(dl.shape, dl.shape + dl.ndim);
  const auto n = detail::checked_numel("tensor.from_dlpack", shape);
  if (!dl.data && n > 0)
    detail::throw_invalid("tensor.from_dlpack",
                          "null data pointer for " + std::to_string(n) + " elements");
  shape_t strides =
      dl.strides ? shape_t(dl.strides, dl.strides + dl.ndim) : detail::contiguous_strides(shape);

  std::shared_ptr<DLManagedTensor> owner(managed, [](DLManagedTensor* m) {
    if (m->deleter) m->deleter(m);
  });
  void* base = dl.data;
  std::size_t offset = static_cast<std::size_t>(dl.byte_offset);
  if (!base) offset = 0;  // zero elements: nothing is ever read
  return make(detail::non_null_base(std::move(owner), base), offset, std::move(shape),
              std::move(strides), t, d);
}

DLManagedTensor* tensor::to_dlpack() const {
  if (!defined()) detail::throw_invalid("tensor.to_dlpack", "undefined tensor");
  auto ctx = std::make_unique<export_context>();
  ctx->keep_alive = *this;
  ctx->shape = shape();
  ctx->strides = strides();
  DLManagedTensor& m = ctx->managed;
  m.dl_tensor.data = data();
  switch (device_.type) {
    case device_type::cpu:
      m.dl_tensor.device = {kDLCPU, 0};
      break;
    case device_type::cuda:
      m.dl_tensor.device = {kDLCUDA, device_.index};
      break;
  }
  m.dl_tensor.ndim = static_cast<int>(shape().size());
  m.dl_tensor.dtype = to_dl_dtype(dtype_);
  m.dl_tensor.shape = ctx->shape.data();
  m.dl_tensor.strides = ctx->strides.data();
  m.dl_tensor.byte_offset = 0;
  m.manager_ctx = ctx.get();
  m.deleter = [](DLManagedTensor* self) { delete static_cast<export_context*>(self->manager_ctx); };
  return &ctx.release()->managed;
}

}  // namespace troupe
