#pragma once
/// Applying a function to every tensor of a nested structure (c10d's
/// _apply_to_tensors), and its two uses in torch.distributed.utils: casting
/// the floating tensors of a structure (_cast_forward_inputs) and moving a
/// structure's tensors to a device (_recursive_to).
///
/// The structure is walked as serialize() walks it (troupe/serialize.hpp):
/// std::vector, std::array, std::map (its values), std::pair, std::optional,
/// troupe::state_dict, troupe::tensor, and any type with an inspect overload
/// (the CAF inspect convention; a user's dataclass); and, as c10d walks
/// Python's tuples, sets and dicts, std::tuple (every element),
/// std::unordered_map (its values; keys are left alone, as std::map's) and
/// std::set / std::unordered_set (every element: the set is rebuilt from the
/// mapped elements with its own comparator or hash, so elements that map to
/// equal ones become one, as a Python set rebuilt by c10d does). Other
/// members (arithmetic, enums, strings) are left alone.

#include <functional>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "troupe/device.hpp"
#include "troupe/dtype.hpp"
#include "troupe/serialize.hpp"
#include "troupe/state_dict.hpp"
#include "troupe/tensor.hpp"

namespace troupe {

using tensor_fn = std::function<tensor(const tensor&)>;

namespace detail {

template <class T>
struct is_tuple : std::false_type {};
template <class... Ts>
struct is_tuple<std::tuple<Ts...>> : std::true_type {};
template <class T>
struct is_unordered_map : std::false_type {};
template <class K, class V, class H, class E, class A>
struct is_unordered_map<std::unordered_map<K, V, H, E, A>> : std::true_type {};
template <class T>
struct is_set : std::false_type {};
template <class K, class C, class A>
struct is_set<std::set<K, C, A>> : std::true_type {};
template <class K, class H, class E, class A>
struct is_set<std::unordered_set<K, H, E, A>> : std::true_type {};

/// Values that hold no tensor: the walk leaves them (and sets of them) alone.
template <class T>
inline constexpr bool tensor_free =
    std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_same_v<T, std::string>;

/// An empty set with `x`'s comparator (or hash and equality) and allocator.
template <class K, class C, class A>
std::set<K, C, A> empty_like(const std::set<K, C, A>& x) {
  return std::set<K, C, A>(x.key_comp(), x.get_allocator());
}
template <class K, class H, class E, class A>
std::unordered_set<K, H, E, A> empty_like(const std::unordered_set<K, H, E, A>& x) {
  return std::unordered_set<K, H, E, A>(x.bucket_count(), x.hash_function(), x.key_eq(),
                                        x.get_allocator());
}

/// An inspector that replaces every tensor it meets by fn(tensor).
class tensor_mapper {
 public:
  using result_type = void;
  static constexpr bool reads_state = true;
  static constexpr bool writes_state = true;

  explicit tensor_mapper(const tensor_fn& fn) : fn_(fn) {}

  template <class... Ts>
  void operator()(Ts&&... xs) {
    (apply(xs), ...);
  }

  template <class T>
  void apply(T& x) {
    if constexpr (tensor_free<T>) {
      // nothing to map
    } else if constexpr (std::is_same_v<T, tensor>) {
      if (x.defined()) x = fn_(x);
    } else if constexpr (std::is_same_v<T, state_dict>) {
      for (auto& [name, t] : x) apply(t);
    } else if constexpr (is_vector<T>::value || is_array<T>::value) {
      for (auto& e : x) apply(e);
    } else if constexpr (is_map<T>::value || is_unordered_map<T>::value) {
      for (auto& [k, v] : x) apply(v);
    } else if constexpr (is_set<T>::value) {
      // Elements are const in place: a new set of the mapped elements.
      if constexpr (!tensor_free<typename T::key_type>) {
        T mapped = empty_like(x);
        for (auto e : x) {
          apply(e);
          mapped.insert(std::move(e));
        }
        x = std::move(mapped);
      }
    } else if constexpr (is_tuple<T>::value) {
      std::apply([this](auto&... e) { (apply(e), ...); }, x);
    } else if constexpr (is_pair<T>::value) {
      apply(x.first);
      apply(x.second);
    } else if constexpr (is_optional<T>::value) {
      if (x) apply(*x);
    } else {
      static_assert(inspectable<tensor_mapper, T>,
                    "troupe: apply_to_tensors cannot walk this type: give it an inspect overload");
      inspect(*this, x);
    }
  }

 private:
  const tensor_fn& fn_;
};

}  // namespace detail

/// `container` with every defined tensor t replaced by fn(t).
template <class T>
T apply_to_tensors(const tensor_fn& fn, T container) {
  detail::tensor_mapper m{fn};
  m.apply(container);
  return container;
}

/// A copy of `t` converted to floating dtype `to` (float16, bfloat16, float32,
/// float64) on t's device; `t` itself when it already has that dtype.
tensor to_dtype(const tensor& t, dtype to);
/// A copy of `t` on `d`; `t` itself when it is already there.
tensor to_device(const tensor& t, const device& d);

/// `container` with its floating tensors cast to `to` (others left as they
/// are), as _cast_forward_inputs.
template <class T>
T cast_floating_tensors(dtype to, T container) {
  return apply_to_tensors(
      [to](const tensor& t) { return is_floating_point(t.scalar_type()) ? to_dtype(t, to) : t; },
      std::move(container));
}

/// `container` with its tensors on `d`, as _recursive_to (without side streams).
template <class T>
T move_to_device(const device& d, T container) {
  return apply_to_tensors([&d](const tensor& t) { return to_device(t, d); }, std::move(container));
}

}  // namespace troupe
