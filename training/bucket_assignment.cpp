#include "troupe/bucket_assignment.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "troupe/error.hpp"

namespace troupe {

namespace {

[[noreturn]] void refuse(const std::string& what) {
  throw error(errc::invalid_argument, "compute_bucket_assignment_by_size: " + what);
}

/// The open bucket of one (dtype, device) and where its key stands in the limits.
struct open_bucket {
  dtype type;
  device dev;
  std::vector<std::size_t> indices;
  std::size_t bytes = 0;
  std::size_t limit_index = 0;
  std::size_t first_position = 0;  // position in `tensors` of the bucket's first tensor
};

}  // namespace

bucket_assignment compute_bucket_assignment_by_size(
    const tensor_list& tensors, const std::vector<std::size_t>& size_limits,
    const std::vector<bool>& expect_sparse, const std::vector<std::int64_t>& tensor_indices) {
  // Check the arguments.
  if (tensors.empty()) refuse("no tensors");
  if (size_limits.empty()) refuse("no size limits");
  for (auto l : size_limits)
    if (l == 0) refuse("a size limit of 0 bytes");
  if (!expect_sparse.empty() && expect_sparse.size() != tensors.size())
    refuse("expect_sparse has " + std::to_string(expect_sparse.size()) + " entries for " +
           std::to_string(tensors.size()) + " tensors");
  if (!tensor_indices.empty()) {
    if (tensor_indices.size() != tensors.size())
      refuse("tensor_indices has " + std::to_string(tensor_indices.size()) + " entries for " +
             std::to_string(tensors.size()) + " tensors");
    std::vector<bool> seen(tensors.size(), false);
    for (auto i : tensor_indices) {
      if (i < 0 || static_cast<std::size_t>(i) >= tensors.size())
        refuse("tensor index " + std::to_string(i) + " out of range for " +
               std::to_string(tensors.size()) + " tensors");
      if (seen[static_cast<std::size_t>(i)])
        refuse("tensor index " + std::to_string(i) + " appears twice");
      seen[static_cast<std::size_t>(i)] = true;
    }
  }
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (!tensors[i].defined()) refuse("tensor " + std::to_string(i) + " is undefined");

  // Fill one open bucket per key; a bucket that reaches its limit closes.
  std::vector<std::pair<std::vector<std::size_t>, std::size_t>> closed;
  std::vector<open_bucket> open;  // few keys: a linear search is fine
  for (std::size_t pos = 0; pos < tensors.size(); ++pos) {
    const auto& t = tensors[pos];
    const auto index = tensor_indices.empty() ? pos : static_cast<std::size_t>(tensor_indices[pos]);
    if (!expect_sparse.empty() && expect_sparse[index]) {
      closed.push_back({{index}, 0});
      continue;
    }
    auto it = std::find_if(open.begin(), open.end(), [&](const open_bucket& b) {
      return b.type == t.scalar_type() && b.dev == t.get_device();
    });
    if (it == open.end()) {
      open.push_back({t.scalar_type(), t.get_device(), {}, 0, 0, pos});
      it = std::prev(open.end());
    }
    auto& b = *it;
    if (b.indices.empty()) b.first_position = pos;
    b.indices.push_back(index);
    b.bytes += t.nbytes();
    const auto limit = size_limits[b.limit_index];
    if (b.bytes >= limit) {
      closed.push_back({std::move(b.indices), limit});
      b.indices.clear();
      b.bytes = 0;
      if (b.limit_index + 1 < size_limits.size()) ++b.limit_index;
    }
  }

  // The buckets still open, in the order of their first tensors.
  std::sort(open.begin(), open.end(), [](const open_bucket& a, const open_bucket& b) {
    return a.first_position < b.first_position;
  });
  for (auto& b : open)
    if (!b.indices.empty()) closed.push_back({std::move(b.indices), size_limits[b.limit_index]});

  // Without explicit indices: ordered by the smallest index each bucket holds.
  if (tensor_indices.empty())
    std::stable_sort(closed.begin(), closed.end(), [](const auto& a, const auto& b) {
      return *std::min_element(a.first.begin(), a.first.end()) <
             *std::min_element(b.first.begin(), b.first.end());
    });

  bucket_assignment r;
  for (auto& [indices, limit] : closed) {
    r.buckets.push_back(std::move(indices));
    r.size_limits.push_back(limit);
  }
  return r;
}

}  // namespace troupe
