// at::Tensor <-> troupe::tensor through DLPack. Bool is the one dtype
// DLPack 0.6 (ATen's copy) has no code for: it crosses as uint8 and the
// receiving side restores the type (troupe's own bool code, 6, or
// view(kBool) on the torch side).

#include "troupe_torch/tensor.hpp"

#include <ATen/DLConvertor.h>
#include <ATen/Functions.h>

#include <sstream>

#include "troupe/error.hpp"

namespace troupe_torch {
namespace {

constexpr std::uint8_t troupe_dl_bool_code = 6;  // troupe's bool code (DLPack >= 0.8: kDLBool)

[[noreturn]] void invalid(const std::string& what) {
  throw troupe::error(troupe::errc::invalid_argument, what);
}

std::string join(c10::IntArrayRef v) {
  std::ostringstream s;
  s << '[';
  for (std::size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  s << ']';
  return s.str();
}

std::string describe(const at::Tensor& t) {
  std::ostringstream s;
  s << t.scalar_type() << " tensor on " << t.device() << " with shape " << join(t.sizes());
  return s.str();
}

}  // namespace

troupe::dtype to_troupe_dtype(c10::ScalarType t, const std::string& what) {
  using troupe::dtype;
  switch (t) {
    case c10::ScalarType::Bool:
      return dtype::bool_;
    case c10::ScalarType::Byte:
      return dtype::uint8;
    case c10::ScalarType::Char:
      return dtype::int8;
    case c10::ScalarType::Short:
      return dtype::int16;
    case c10::ScalarType::Int:
      return dtype::int32;
    case c10::ScalarType::Long:
      return dtype::int64;
    case c10::ScalarType::Half:
      return dtype::float16;
    case c10::ScalarType::BFloat16:
      return dtype::bfloat16;
    case c10::ScalarType::Float:
      return dtype::float32;
    case c10::ScalarType::Double:
      return dtype::float64;
    case c10::ScalarType::ComplexFloat:
      return dtype::complex64;
    case c10::ScalarType::ComplexDouble:
      return dtype::complex128;
    default:
      break;
  }
  std::ostringstream s;
  s << "troupe_torch: " << what << " has dtype " << t
    << ", which troupe does not support (bool, uint8, int8, int16, int32, int64, float16, "
       "bfloat16, float32, float64, complex64, complex128)";
  invalid(s.str());
}

c10::ScalarType to_torch_dtype(troupe::dtype t) {
  using troupe::dtype;
  switch (t) {
    case dtype::bool_:
      return c10::ScalarType::Bool;
    case dtype::uint8:
      return c10::ScalarType::Byte;
    case dtype::int8:
      return c10::ScalarType::Char;
    case dtype::int16:
      return c10::ScalarType::Short;
    case dtype::int32:
      return c10::ScalarType::Int;
    case dtype::int64:
      return c10::ScalarType::Long;
    case dtype::float16:
      return c10::ScalarType::Half;
    case dtype::bfloat16:
      return c10::ScalarType::BFloat16;
    case dtype::float32:
      return c10::ScalarType::Float;
    case dtype::float64:
      return c10::ScalarType::Double;
    case dtype::complex64:
      return c10::ScalarType::ComplexFloat;
    case dtype::complex128:
      return c10::ScalarType::ComplexDouble;
  }
  invalid("troupe_torch: unknown troupe dtype " + std::to_string(static_cast<int>(t)));
}

troupe::tensor to_troupe(const at::Tensor& t) {
  if (!t.defined()) invalid("troupe_torch.to_troupe: undefined tensor");
  if (t.layout() != c10::kStrided)
    invalid("troupe_torch.to_troupe: " + describe(t) +
            " is not strided (sparse or another layout); troupe takes dense tensors");
  if (!t.is_cpu() && !t.is_cuda())
    invalid("troupe_torch.to_troupe: " + describe(t) + " lives on a device troupe cannot reach");
  const bool is_bool = t.scalar_type() == c10::ScalarType::Bool;
  (void)to_troupe_dtype(t.scalar_type());  // names the dtype troupe lacks
  if (t.is_conj() || t.is_neg())
    invalid("troupe_torch.to_troupe: " + describe(t) +
            " is a lazy conjugate or negative view; call .resolve_conj() / .resolve_neg() first");
  DLManagedTensor* managed = nullptr;
  try {
    managed = at::toDLPack(is_bool ? t.view(c10::ScalarType::Byte) : t);
  } catch (const c10::Error& e) {
    invalid("troupe_torch.to_troupe: " + describe(t) + ": " + e.what_without_backtrace());
  }
  if (is_bool) managed->dl_tensor.dtype = {troupe_dl_bool_code, 8, 1};
  try {
    return troupe::tensor::from_dlpack(managed);
  } catch (...) {
    if (managed->deleter) managed->deleter(managed);  // from_dlpack did not take it
    throw;
  }
}

at::Tensor to_torch(const troupe::tensor& t) {
  if (!t.defined()) invalid("troupe_torch.to_torch: undefined tensor");
  DLManagedTensor* managed = t.to_dlpack();
  const bool is_bool = t.scalar_type() == troupe::dtype::bool_;
  if (is_bool) managed->dl_tensor.dtype = {kDLUInt, 8, 1};
  at::Tensor r;
  try {
    r = at::fromDLPack(managed);  // owns `managed` from here on
  } catch (const c10::Error& e) {
    // fromDLPack checks device and dtype before it takes ownership.
    if (managed->deleter) managed->deleter(managed);
    invalid("troupe_torch.to_torch: " + t.describe() + ": " + e.what_without_backtrace());
  }
  return is_bool ? r.view(c10::ScalarType::Bool) : r;
}

troupe::tensor to_troupe_dense(const at::Tensor& t, const char* op, const std::string& what) {
  if (!t.defined()) invalid(std::string(op) + ": " + what + " is undefined");
  if (!t.is_contiguous())
    invalid(std::string(op) + ": " + what + " (" + describe(t) + ", strides " + join(t.strides()) +
            ") is not contiguous; call .contiguous() first");
  try {
    return to_troupe(t);
  } catch (const troupe::error& e) {
    invalid(std::string(op) + ": " + what + ": " + e.what());
  }
}

troupe::tensor_list to_troupe_dense(const std::vector<at::Tensor>& ts, const char* op,
                                    const std::string& what) {
  troupe::tensor_list r;
  r.reserve(ts.size());
  for (std::size_t i = 0; i < ts.size(); ++i)
    r.push_back(to_troupe_dense(ts[i], op, what + " " + std::to_string(i)));
  return r;
}

}  // namespace troupe_torch
