#include "api/validate.hpp"

#include "troupe/error.hpp"

namespace troupe::detail {

void validator::fail(const std::string& what) const {
  throw error(errc::invalid_argument, std::string(op_) + ": " + what);
}

void validator::tensors(std::span<const tensor> ts, const char* what, std::size_t min) const {
  if (ts.size() < min)
    fail(std::string(what) + " must hold at least " + std::to_string(min) + " tensor(s), got " +
         std::to_string(ts.size()));
  for (std::size_t i = 0; i < ts.size(); ++i) usable(ts[i], what, i);
  if (ts.size() > 1) same_dtype(ts, ts.front());  // one tensor agrees with itself
}

void validator::pair(const tensor& first, const tensor& second, const char* what) const {
  usable(first, what, 0);
  usable(second, what, 1);
  same_dtype({&second, 1}, first);
}

void validator::usable(const tensor& t, const char* what, std::size_t i) const {
  auto name = [&] { return std::string(what) + "[" + std::to_string(i) + "]"; };
  if (!t.defined()) fail(name() + " is an undefined tensor");
  if (!t.is_contiguous())
    fail(name() + " is non-contiguous (" + t.describe() +
         "); collectives need contiguous tensors: pass a contiguous copy");
}

void validator::same_dtype(std::span<const tensor> ts, const tensor& ref) const {
  for (auto& t : ts) {
    if (t.scalar_type() != ref.scalar_type())
      fail("tensors with different dtypes: " + std::string(to_string(ref.scalar_type())) + " and " +
           std::string(to_string(t.scalar_type())));
    if (!(t.get_device() == ref.get_device()))
      fail("tensors on different devices: " + to_string(ref.get_device()) + " and " +
           to_string(t.get_device()));
  }
}

void validator::mixed(std::span<const tensor> ts, const char* what) const {
  if (ts.empty()) fail(std::string(what) + " must hold at least 1 tensor(s), got 0");
  for (std::size_t i = 0; i < ts.size(); ++i) {
    usable(ts[i], what, i);
    if (!(ts[i].get_device() == ts[0].get_device()))
      fail("tensors on different devices: " + to_string(ts[0].get_device()) + " and " +
           to_string(ts[i].get_device()));
  }
}

void validator::dtypes_by_position(std::span<const tensor> outs, const char* outs_name,
                                   std::span<const tensor> ins, const char* ins_name,
                                   std::ptrdiff_t list) const {
  for (std::size_t i = 0; i < outs.size() && i < ins.size(); ++i) {
    if (outs[i].scalar_type() == ins[i].scalar_type() &&
        outs[i].get_device() == ins[i].get_device())
      continue;
    const auto at = "[" + std::to_string(i) + "]";
    const auto out =
        std::string(outs_name) + (list >= 0 ? "[" + std::to_string(list) + "]" : "") + at;
    if (outs[i].scalar_type() != ins[i].scalar_type())
      fail(out + " is " + std::string(to_string(outs[i].scalar_type())) + " but " + ins_name + at +
           " is " + std::string(to_string(ins[i].scalar_type())) +
           ": each output has its input's dtype");
    fail(out + " is on " + to_string(outs[i].get_device()) + " but " + ins_name + at + " is on " +
         to_string(ins[i].get_device()));
  }
}

namespace {

/// The dtype a complex tensor is made of (complex64: float32); others as they are.
dtype real_of(dtype t) {
  return t == dtype::complex64 ? dtype::float32 : t == dtype::complex128 ? dtype::float64 : t;
}

}  // namespace

bool validator::same_real_dtype(std::span<const tensor> ts, const char* what) const {
  if (ts.empty()) fail(std::string(what) + " must hold at least 1 tensor(s), got 0");
  bool mixes = false;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    usable(ts[i], what, i);
    const auto a = ts[0].scalar_type(), b = ts[i].scalar_type();
    if (!(ts[i].get_device() == ts[0].get_device()))
      fail("tensors on different devices: " + to_string(ts[0].get_device()) + " and " +
           to_string(ts[i].get_device()));
    if (a == b) continue;
    if (real_of(a) != real_of(b))
      fail("tensors with different dtypes: " + std::string(to_string(a)) + " and " +
           std::string(to_string(b)) +
           " (a complex tensor mixes only with its element type: complex64 with float32, "
           "complex128 with float64)");
    mixes = true;
  }
  return mixes;
}

void validator::rank_arg(int r, const char* what) const {
  if (r < 0 || r >= size_)
    fail(std::string(what) + " " + std::to_string(r) + " is out of range for a group of size " +
         std::to_string(size_));
}

void validator::length(std::size_t got, std::size_t n, const char* what) const {
  if (got != n)
    fail(std::string(what) + " must have " + std::to_string(n) + " entries, got " +
         std::to_string(got));
}

void validator::numel(std::int64_t got, std::int64_t expected, const char* what) const {
  if (got != expected)
    fail(std::string(what) + " has " + std::to_string(got) + " elements, expected " +
         std::to_string(expected));
}

std::int64_t validator::counts(const std::vector<std::int64_t>& c, const char* what) const {
  length(c.size(), static_cast<std::size_t>(size_), what);
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (c[i] < 0)
      fail(std::string(what) + "[" + std::to_string(i) + "] is negative (" + std::to_string(c[i]) +
           ")");
    sum += c[i];
  }
  (void)rank_;
  return sum;
}

std::int64_t validator::blocks(const std::vector<std::int64_t>& c, const tensor& block,
                               const char* name) const {
  const auto sum = counts(c, "counts");
  numel(block.numel(), c[static_cast<std::size_t>(rank_)],
        (std::string(name) + " (counts[rank])").c_str());
  return sum;
}

void validator::all_blocks(const tensor& all, std::int64_t sum, const char* name) const {
  numel(all.numel(), sum, (std::string(name) + " (sum of counts)").c_str());
}

}  // namespace troupe::detail
