#include "troupe/comm_hook.hpp"

#include <utility>

#include "troupe/error.hpp"

namespace troupe {

grad_bucket::grad_bucket(std::size_t index, std::size_t bucket_count, tensor buffer,
                         std::vector<std::size_t> parameter_indices,
                         std::vector<std::int64_t> offsets, std::vector<shape_t> shapes)
    : index_(index),
      count_(bucket_count),
      buffer_(std::move(buffer)),
      params_(std::move(parameter_indices)),
      offsets_(std::move(offsets)),
      shapes_(std::move(shapes)) {
  auto refuse = [](const std::string& what) {
    throw error(errc::invalid_argument, "grad_bucket: " + what);
  };
  if (index_ >= count_)
    refuse("index " + std::to_string(index_) + " out of range for " + std::to_string(count_) +
           " buckets");
  if (!buffer_.defined() || !buffer_.is_contiguous() || buffer_.dim() != 1)
    refuse("the buffer must be a flat contiguous tensor, got " +
           (buffer_.defined() ? buffer_.describe() : std::string("an undefined tensor")));
  if (params_.size() != offsets_.size() || params_.size() != shapes_.size())
    refuse(std::to_string(params_.size()) + " parameters, " + std::to_string(offsets_.size()) +
           " offsets and " + std::to_string(shapes_.size()) + " shapes");
  for (std::size_t i = 0; i < shapes_.size(); ++i) {
    std::int64_t numel = 1;
    for (auto d : shapes_[i]) numel *= d;
    if (offsets_[i] < 0 || numel < 0 || offsets_[i] + numel > buffer_.numel())
      refuse("gradient " + std::to_string(i) + " at offset " + std::to_string(offsets_[i]) +
             " with " + std::to_string(numel) + " elements does not fit the buffer of " +
             std::to_string(buffer_.numel()));
  }
}

tensor_list grad_bucket::gradients() const {
  tensor_list r;
  for (std::size_t i = 0; i < shapes_.size(); ++i) {
    std::int64_t numel = 1;
    for (auto d : shapes_[i]) numel *= d;
    r.push_back(buffer_.flat_slice(offsets_[i], numel).view(shapes_[i]));
  }
  return r;
}

}  // namespace troupe
