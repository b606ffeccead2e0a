#pragma once
/// troupe::reduce_op — how a reduction combines values (c10d's ReduceOp).

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "troupe/dtype.hpp"
#include "troupe/tensor.hpp"

namespace troupe {

class reduce_op {
 public:
  enum kind : std::uint8_t { SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM };

  /// SUM by default; implicit from a kind so `reduce_op::MAX` works where a reduce_op is expected.
  reduce_op(kind k = SUM);  // NOLINT(google-explicit-constructor)

  /// PREMUL_SUM: each rank's input is multiplied by `scale`, then summed.
  static reduce_op premul_sum(double scale);
  /// PREMUL_SUM with the scale in a one-element floating tensor (read when the op runs).
  static reduce_op premul_sum(const tensor& scale);

  kind op() const noexcept { return kind_; }
  /// The scale of a PREMUL_SUM as a double (reads a tensor scale); 1.0 otherwise.
  double scale() const;
  bool has_tensor_scale() const noexcept { return std::holds_alternative<tensor>(scale_); }

  /// Equal when the kinds are equal and, for PREMUL_SUM, the scales are equal.
  friend bool operator==(const reduce_op& a, const reduce_op& b);
  friend bool operator==(const reduce_op& a, kind b) { return a.kind_ == b && b != PREMUL_SUM; }

  /// Bytes that deserialize() turns back into an equal reduce_op (a tensor scale
  /// is stored by value).
  std::vector<std::uint8_t> serialize() const;
  static reduce_op deserialize(const std::vector<std::uint8_t>& bytes);

  /// "SUM", "PREMUL_SUM(0.5)".
  std::string to_string() const;

 private:
  kind kind_ = SUM;
  std::variant<std::monostate, double, tensor> scale_;
};

/// "SUM", "AVG", ...
const char* to_string(reduce_op::kind k) noexcept;

/// Whether reductions with `k` are defined for `t` (the rules check_reduce_supported enforces).
bool is_reduce_supported(reduce_op::kind k, dtype t) noexcept;

/// Throws errc::invalid_argument naming `op_name`, the reduce op and the dtype
/// when `op` is not defined for `t` (bitwise on floating/complex, MIN/MAX on
/// complex, AVG or PREMUL_SUM on integer/bool, ...).
void check_reduce_supported(const char* op_name, const reduce_op& op, dtype t);

}  // namespace troupe
