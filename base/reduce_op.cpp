// troupe::reduce_op: kinds, PREMUL_SUM scales, (de)serialisation, dtype rules.

#include "troupe/reduce_op.hpp"

#include <bit>
#include <charconv>
#include <cstring>
#include <string>

#include "base/texts.hpp"
#include "troupe/error.hpp"

namespace troupe {
namespace {

// Scale kinds in the serialised form.
enum scale_tag : std::uint8_t { no_scale = 0, double_scale = 1, tensor_scale = 2 };

std::string format_double(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

double read_scale_tensor(const tensor& t) {
  const void* p = t.data();
  switch (t.scalar_type()) {
    case dtype::float16:
      return static_cast<float>(*static_cast<const float16_t*>(p));
    case dtype::bfloat16:
      return static_cast<float>(*static_cast<const bfloat16_t*>(p));
    case dtype::float32:
      return *static_cast<const float*>(p);
    case dtype::float64:
      return *static_cast<const double*>(p);
    default:
      break;
  }
  detail::throw_invalid("reduce_op.scale",
                        "scale tensor has dtype " + std::string(to_string(t.scalar_type())));
}

}  // namespace

const char* to_string(reduce_op::kind k) noexcept {
  switch (k) {
    case reduce_op::SUM:
      return "SUM";
    case reduce_op::AVG:
      return "AVG";
    case reduce_op::PRODUCT:
      return "PRODUCT";
    case reduce_op::MIN:
      return "MIN";
    case reduce_op::MAX:
      return "MAX";
    case reduce_op::BAND:
      return "BAND";
    case reduce_op::BOR:
      return "BOR";
    case reduce_op::BXOR:
      return "BXOR";
    case reduce_op::PREMUL_SUM:
      return "PREMUL_SUM";
  }
  return "UNKNOWN";
}

reduce_op::reduce_op(kind k) : kind_(k) {
  if (k > PREMUL_SUM)
    detail::throw_invalid("reduce_op", "unknown kind " + std::to_string(static_cast<int>(k)));
  if (k == PREMUL_SUM)
    detail::throw_invalid("reduce_op",
                          "PREMUL_SUM needs a scale: use reduce_op::premul_sum(scale)");
}

reduce_op reduce_op::premul_sum(double scale) {
  reduce_op r;
  r.kind_ = PREMUL_SUM;
  r.scale_ = scale;
  return r;
}

reduce_op reduce_op::premul_sum(const tensor& scale) {
  const char* op = "reduce_op.premul_sum";
  if (!scale.defined()) detail::throw_invalid(op, "scale tensor is undefined");
  if (!is_floating_point(scale.scalar_type()))
    detail::throw_invalid(op, "scale tensor must be float16, bfloat16, float32 or float64, got " +
                                  std::string(troupe::to_string(scale.scalar_type())));
  if (scale.numel() != 1)
    detail::throw_invalid(
        op, "scale tensor must have one element, got " + std::to_string(scale.numel()));
  if (!scale.is_cpu())
    detail::throw_invalid(
        op, "scale tensor must be on cpu, got " + troupe::to_string(scale.get_device()));
  reduce_op r;
  r.kind_ = PREMUL_SUM;
  r.scale_ = scale;
  return r;
}

double reduce_op::scale() const {
  if (auto* d = std::get_if<double>(&scale_)) return *d;
  if (auto* t = std::get_if<tensor>(&scale_)) return read_scale_tensor(*t);
  return 1.0;
}

bool operator==(const reduce_op& a, const reduce_op& b) {
  if (a.kind_ != b.kind_) return false;
  return a.kind_ != reduce_op::PREMUL_SUM || a.scale() == b.scale();
}

std::vector<std::uint8_t> reduce_op::serialize() const {
  // kind byte, scale tag byte, then (with a scale) the double's bits, little endian.
  std::vector<std::uint8_t> out{kind_, no_scale};
  if (kind_ != PREMUL_SUM) return out;
  out[1] = has_tensor_scale() ? tensor_scale : double_scale;
  const auto bits = std::bit_cast<std::uint64_t>(scale());
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(bits >> (8 * i)));
  return out;
}

reduce_op reduce_op::deserialize(const std::vector<std::uint8_t>& bytes) {
  const char* op = "reduce_op.deserialize";
  if (bytes.size() < 2)
    detail::throw_invalid(op, "need at least 2 bytes, got " + std::to_string(bytes.size()));
  const auto k = bytes[0];
  const auto tag = bytes[1];
  if (k > PREMUL_SUM) detail::throw_invalid(op, "bad kind byte " + std::to_string(k));
  if (tag > tensor_scale) detail::throw_invalid(op, "bad scale kind byte " + std::to_string(tag));
  if (k != PREMUL_SUM) {
    if (tag != no_scale || bytes.size() != 2)
      detail::throw_invalid(op, std::string(troupe::to_string(static_cast<kind>(k))) +
                                    " takes no scale, got " + std::to_string(bytes.size()) +
                                    " bytes with scale kind " + std::to_string(tag));
    return reduce_op(static_cast<kind>(k));
  }
  if (tag == no_scale || bytes.size() != 10)
    detail::throw_invalid(op, "PREMUL_SUM needs scale kind 1 or 2 and 10 bytes, got scale kind " +
                                  std::to_string(tag) + " and " + std::to_string(bytes.size()) +
                                  " bytes");
  std::uint64_t bits = 0;
  for (int i = 0; i < 8; ++i) bits |= static_cast<std::uint64_t>(bytes[2 + i]) << (8 * i);
  const double v = std::bit_cast<double>(bits);
  if (tag == tensor_scale) return premul_sum(tensor::from_vector<double>({v}));
  return premul_sum(v);
}

std::string reduce_op::to_string() const {
  if (kind_ != PREMUL_SUM) return troupe::to_string(kind_);
  return "PREMUL_SUM(" + format_double(scale()) + ")";
}

bool is_reduce_supported(reduce_op::kind k, dtype t) noexcept {
  const bool floating = is_floating_point(t) || is_complex(t);
  switch (k) {
    case reduce_op::SUM:
    case reduce_op::PRODUCT:
      return true;
    case reduce_op::MIN:
    case reduce_op::MAX:
      return !is_complex(t);
    case reduce_op::AVG:
    case reduce_op::PREMUL_SUM:
      return floating;
    case reduce_op::BAND:
    case reduce_op::BOR:
    case reduce_op::BXOR:
      return is_integral(t) || t == dtype::bool_;
  }
  return false;
}

void check_reduce_supported(const char* op_name, const reduce_op& op, dtype t) {
  if (is_reduce_supported(op.op(), t)) return;
  throw error(errc::invalid_argument, std::string(op_name) + ": ReduceOp " + to_string(op.op()) +
                                          " is not supported for dtype " +
                                          std::string(to_string(t)));
}

}  // namespace troupe
