#pragma once
/// troupe::state_dict — a module's named tensors in definition order (the
/// OrderedDict that torch's state_dict(), named_parameters() and
/// named_buffers() give), and c10d's prefix replacement on it.

#include <cstddef>
#include <initializer_list>
#include <list>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "troupe/tensor.hpp"

namespace troupe {

class state_dict {
 public:
  using value_type = std::pair<std::string, tensor>;
  using const_iterator = std::list<value_type>::const_iterator;
  using iterator = std::list<value_type>::iterator;

  state_dict() = default;
  /// Entries in order; errc::invalid_argument for a name given twice.
  state_dict(std::initializer_list<value_type> entries);
  state_dict(const state_dict& other);
  state_dict& operator=(const state_dict& other);
  state_dict(state_dict&&) noexcept = default;
  state_dict& operator=(state_dict&&) noexcept = default;

  /// Adds `name` at the end, or replaces its tensor where it stands (Python's d[name] = t).
  void set(const std::string& name, tensor t);
  /// Removes `name`; false when it was not there.
  bool erase(const std::string& name);
  bool contains(const std::string& name) const;
  /// The tensor of `name`; errc::invalid_argument naming it when absent.
  const tensor& at(const std::string& name) const;

  std::size_t size() const noexcept { return items_.size(); }
  bool empty() const noexcept { return items_.empty(); }
  const_iterator begin() const noexcept { return items_.begin(); }
  const_iterator end() const noexcept { return items_.end(); }
  iterator begin() noexcept { return items_.begin(); }
  iterator end() noexcept { return items_.end(); }
  /// The names, in order.
  std::vector<std::string> names() const;
  /// The tensors, in order.
  tensor_list tensors() const;

 private:
  void reindex();
  std::list<value_type> items_;
  std::unordered_map<std::string, iterator> index_;
};

/// Renames every key that starts with `old_prefix` to start with `new_prefix`
/// instead, in place, exactly as c10d's _replace_by_prefix: keys are visited
/// in order; a renamed entry moves to the end, or replaces the tensor of an
/// entry that already has the new name. errc::invalid_argument with
/// "old_prefix and new_prefix must be distinct" when they are equal.
void replace_by_prefix(state_dict& sd, const std::string& old_prefix,
                       const std::string& new_prefix);

}  // namespace troupe
