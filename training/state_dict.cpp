#include "troupe/state_dict.hpp"

#include "troupe/error.hpp"

namespace troupe {

state_dict::state_dict(std::initializer_list<value_type> entries) {
  for (auto& [name, t] : entries) {
    if (contains(name))
      throw error(errc::invalid_argument, "state_dict: name '" + name + "' given twice");
    set(name, t);
  }
}

state_dict::state_dict(const state_dict& other) : items_(other.items_) {
  reindex();
}

state_dict& state_dict::operator=(const state_dict& other) {
  if (this != &other) {
    items_ = other.items_;
    reindex();
  }
  return *this;
}

void state_dict::reindex() {
  index_.clear();
  for (auto it = items_.begin(); it != items_.end(); ++it) index_[it->first] = it;
}

void state_dict::set(const std::string& name, tensor t) {
  if (auto it = index_.find(name); it != index_.end()) {
    it->second->second = std::move(t);
    return;
  }
  items_.emplace_back(name, std::move(t));
  index_[name] = std::prev(items_.end());
}

bool state_dict::erase(const std::string& name) {
  auto it = index_.find(name);
  if (it == index_.end()) return false;
  items_.erase(it->second);
  index_.erase(it);
  return true;
}

bool state_dict::contains(const std::string& name) const {
  return index_.count(name) != 0;
}

const tensor& state_dict::at(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    throw error(errc::invalid_argument, "state_dict.at: no entry named '" + name + "'");
  return it->second->second;
}

std::vector<std::string> state_dict::names() const {
  std::vector<std::string> r;
  for (auto& [name, t] : items_) r.push_back(name);
  return r;
}

tensor_list state_dict::tensors() const {
  tensor_list r;
  for (auto& [name, t] : items_) r.push_back(t);
  return r;
}

void replace_by_prefix(state_dict& sd, const std::string& old_prefix,
                       const std::string& new_prefix) {
  if (old_prefix == new_prefix)
    throw error(errc::invalid_argument,
                "replace_by_prefix: old_prefix and new_prefix must be distinct");
  // As the seed: a snapshot of the keys, then d[new] = d[old]; del d[old].
  for (const auto& key : sd.names()) {
    if (key.compare(0, old_prefix.size(), old_prefix) != 0) continue;
    auto t = sd.at(key);
    sd.set(new_prefix + key.substr(old_prefix.size()), std::move(t));
    sd.erase(key);
  }
}

}  // namespace troupe
