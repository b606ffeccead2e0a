#include "backends/mixed_blocks.hpp"

#include <cstring>
#include <string>
#include <vector>

#include "base/agreement.hpp"
#include "base/tensor_util.hpp"
#include "base/texts.hpp"

namespace troupe::detail {

namespace {

constexpr std::int64_t word = sizeof(std::int64_t);

/// A rank's layout: its tensor count, then (element count << 8 | dtype) per tensor.
std::vector<std::int64_t> layout_of(const tensor_list& ts) {
  std::vector<std::int64_t> l{static_cast<std::int64_t>(ts.size())};
  for (auto& t : ts) l.push_back(t.numel() << 8 | static_cast<std::int64_t>(t.scalar_type()));
  return l;
}

/// `n` bytes of `t` from byte `at`, on the host.
tensor host_bytes(const tensor& t, std::int64_t at, std::int64_t n) {
  auto part = t.flat_slice(at, n);
  if (part.is_cpu()) return part;
  auto host = tensor::empty({n}, dtype::uint8);
  host.copy_from(part);
  return host;
}

/// The layout at the start of rank r's block of `block` bytes: its count,
/// then the words the count says; empty when they do not fit the block
/// (not a layout). Every rank reads the same of each block.
std::vector<std::int64_t> read_layout(const tensor& gathered, int r, std::int64_t block) {
  // (Copied out: a block need not start on a word.)
  auto words = [&](std::int64_t n) {
    std::vector<std::int64_t> w(static_cast<std::size_t>(n));
    std::memcpy(w.data(), host_bytes(gathered, r * block, n * word).data(),
                static_cast<std::size_t>(n * word));
    return w;
  };
  if (block < word) return {};
  const auto count = words(1)[0];
  if (count < 0 || count >= block / word) return {};
  return words(count + 1);
}

/// "(float32 x 2, int64 x 1)".
std::string describe(const std::vector<std::int64_t>& l) {
  if (l.empty()) return "(no layout)";
  std::string s = "(";
  for (std::size_t i = 1; i < l.size(); ++i) {
    const auto t = l[i] & 0xff;
    s += (i > 1 ? ", " : "") +
         (t < dtype_count ? std::string(to_string(static_cast<dtype>(t)))
                          : "dtype " + std::to_string(t)) +
         " x " + std::to_string(l[i] >> 8);
  }
  return s + ")";
}

}  // namespace

bool one_dtype(const tensor_list& ts) {
  for (auto& t : ts)
    if (t.scalar_type() != ts.front().scalar_type()) return false;
  return true;
}

tensor mixed_block(const tensor_list& ins) {
  const auto layout = layout_of(ins);
  auto bytes = static_cast<std::int64_t>(layout.size()) * word;
  for (auto& t : ins) bytes += static_cast<std::int64_t>(t.nbytes());
  auto block = tensor::empty({bytes}, dtype::uint8, ins.front().get_device());
  auto head = tensor::from_blob(const_cast<std::int64_t*>(layout.data()),
                                {static_cast<std::int64_t>(layout.size()) * word}, dtype::uint8);
  std::int64_t off = 0;
  block.flat_slice(off, head.numel()).copy_from(head);
  off += head.numel();
  for (auto& t : ins) {
    const auto n = static_cast<std::int64_t>(t.nbytes());
    block.flat_slice(off, n).copy_from(tensor_access::reinterpreted(t, dtype::uint8));
    off += n;
  }
  return block;
}

void unpack_mixed_blocks(const char* op, const tensor& gathered, int size, std::size_t count,
                         const block_output& out) {
  const auto block = size > 0 ? gathered.numel() / size : 0;
  const auto head = static_cast<std::int64_t>(count + 1) * word;
  // Every rank's layout, read on the host; ranks grouped by the layout they passed.
  std::vector<std::vector<std::int64_t>> layouts;
  std::vector<std::vector<int>> classes;
  for (int r = 0; r < size; ++r) {
    auto l = read_layout(gathered, r, block);
    std::size_t c = 0;
    while (c < layouts.size() && layouts[c] != l) ++c;
    if (c == layouts.size()) {
      layouts.push_back(std::move(l));
      classes.emplace_back();
    }
    classes[c].push_back(r);
  }
  if (classes.size() > 1) {
    std::string why = std::string(op) + ": ";
    for (std::size_t c = 0; c < classes.size(); ++c)
      why += (c ? "; " : "") + ranks_text(classes[c]) + " passed tensors " + describe(layouts[c]);
    throw disagreement_error(why + " (the dtypes or element counts of their tensors differ)");
  }
  for (int r = 0; r < size; ++r) {
    auto off = r * block + head;
    for (std::size_t i = 0; i < count; ++i) {
      auto dst = tensor_access::reinterpreted(out(r, i), dtype::uint8);
      dst.copy_from(gathered.flat_slice(off, dst.numel()));
      off += dst.numel();
    }
  }
}

}  // namespace troupe::detail
