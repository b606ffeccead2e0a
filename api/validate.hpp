#pragma once
// Argument checks shared by the process_group calls. Each throws
// troupe::error(errc::invalid_argument) with a message that starts with the
// call's name and names the offending value.

#include <span>
#include <string>
#include <vector>

#include "troupe/tensor.hpp"

namespace troupe::detail {

class validator {
 public:
  validator(const char* op, int rank, int size) : op_(op), rank_(rank), size_(size) {}
  /// The calling rank and the group's size.
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  [[noreturn]] void fail(const std::string& what) const;
  /// Non-empty list (when `min` is 1) of defined, contiguous tensors of one dtype and device.
  /// (A span: a call's single tensor is checked without building a list.)
  void tensors(std::span<const tensor> ts, const char* what, std::size_t min = 1) const;
  void tensor1(const tensor& t, const char* what) const { tensors({&t, 1}, what); }
  /// tensors() of the list {first, second}, without copying them into one
  /// (each copy counts two owners up and down).
  void pair(const tensor& first, const tensor& second, const char* what) const;
  /// All tensors have the dtype (and device) of `ref`.
  void same_dtype(std::span<const tensor> ts, const tensor& ref) const;
  /// Non-empty list of defined, contiguous tensors on one device, each of
  /// any dtype (c10d's allgather_coalesced takes them so).
  void mixed(std::span<const tensor> ts, const char* what) const;
  /// outputs[i] has the dtype and device of inputs[i] ("<outs>[i] is int64
  /// but <ins>[i] is float32"; "<outs>[list][i]" where `list` >= 0 says
  /// which of several lists of outputs it is).
  void dtypes_by_position(std::span<const tensor> outs, const char* outs_name,
                          std::span<const tensor> ins, const char* ins_name,
                          std::ptrdiff_t list = -1) const;
  /// A list that reduces as one dtype (tensors() with one exception, as
  /// c10d's _ensure_all_tensors_same_dtype): complex tensors may mix with
  /// their element type (complex64 with float32, complex128 with float64),
  /// as the reals they are made of. Returns whether they do.
  bool same_real_dtype(std::span<const tensor> ts, const char* what) const;
  /// A rank argument (root, peer) is in [0, size).
  void rank_arg(int r, const char* what) const;
  /// A list has exactly `n` entries.
  void length(std::size_t got, std::size_t n, const char* what) const;
  /// Two element counts are equal.
  void numel(std::int64_t got, std::int64_t expected, const char* what) const;
  /// counts has `size` non-negative entries; returns their sum.
  std::int64_t counts(const std::vector<std::int64_t>& c, const char* what) const;
  /// The variable-size calls: `counts` (one per rank) are valid and this
  /// rank's block `block` holds counts[rank] elements ("<name> (counts[rank])");
  /// returns the counts' sum.
  std::int64_t blocks(const std::vector<std::int64_t>& counts, const tensor& block,
                      const char* name) const;
  /// `all` holds every rank's block: the counts' sum ("<name> (sum of counts)").
  void all_blocks(const tensor& all, std::int64_t sum, const char* name) const;

  const char* op() const noexcept { return op_; }

 private:
  /// `t`, entry i of the list `what`, is defined and contiguous.
  void usable(const tensor& t, const char* what, std::size_t i) const;

  const char* op_;
  int rank_;
  int size_;
};

}  // namespace troupe::detail
