#pragma once
/// Walking the at::Tensors of a nested structure (c10d's _apply_to_tensors
/// and the tree flattening torch's DDP does on a forward's output), for what
/// a module's forward returns: distributed_data_parallel finds every tensor
/// of the output with it, whatever the output's shape.
///
///   std::map<std::string, std::pair<at::Tensor, std::optional<at::Tensor>>> out = ...;
///   troupe_torch::for_each_tensor(out, [](const at::Tensor& t) { ... });
///   troupe_torch::apply_to_tensors(out, [](at::Tensor& t) { t = t * 2; });
///
/// Walked: at::Tensor; std::vector, std::deque, std::list, std::array;
/// std::map, std::unordered_map, std::multimap (their values); std::pair,
/// std::tuple, std::optional, c10::optional, std::variant; torch::OrderedDict
/// (values); and any nesting of these. Left alone: arithmetic types, enums,
/// strings. A type of your own opts in as it does for troupe's serialization
/// (troupe/serialize.hpp): a free function found by ADL, in the CAF inspect
/// convention, that hands its members to the inspector:
///
///   struct detection { at::Tensor boxes, scores; std::vector<at::Tensor> masks; int count; };
///   template <class Inspector>
///   auto inspect(Inspector& f, detection& d) { return f(d.boxes, d.scores, d.masks, d.count); }
///
/// A type that is none of these and has no inspect overload fails to compile
/// with a static_assert naming this requirement (a tensor the walk could not
/// see would silently take no part in find_unused_parameters).
///
/// Tensors are visited in a fixed order (containers in iteration order, a
/// struct's members in the order its inspect names them), undefined ones
/// included; two walks of an unchanged structure visit the same tensors in
/// the same order.

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/ordered_dict.h>

#include <array>
#include <deque>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace troupe_torch {
namespace detail {

template <class T>
struct is_sequence : std::false_type {};
template <class T, class A>
struct is_sequence<std::vector<T, A>> : std::true_type {};
template <class T, class A>
struct is_sequence<std::deque<T, A>> : std::true_type {};
template <class T, class A>
struct is_sequence<std::list<T, A>> : std::true_type {};
template <class T, std::size_t N>
struct is_sequence<std::array<T, N>> : std::true_type {};

template <class T>
struct is_mapping : std::false_type {};
template <class K, class V, class C, class A>
struct is_mapping<std::map<K, V, C, A>> : std::true_type {};
template <class K, class V, class C, class A>
struct is_mapping<std::multimap<K, V, C, A>> : std::true_type {};
template <class K, class V, class H, class E, class A>
struct is_mapping<std::unordered_map<K, V, H, E, A>> : std::true_type {};

template <class T>
struct is_ordered_dict : std::false_type {};
template <class K, class V>
struct is_ordered_dict<torch::OrderedDict<K, V>> : std::true_type {};

template <class T>
struct is_pair_or_tuple : std::false_type {};
template <class A, class B>
struct is_pair_or_tuple<std::pair<A, B>> : std::true_type {};
template <class... Ts>
struct is_pair_or_tuple<std::tuple<Ts...>> : std::true_type {};

template <class T>
struct is_maybe : std::false_type {};
template <class T>
struct is_maybe<std::optional<T>> : std::true_type {};
template <class T>
struct is_maybe<c10::optional<T>> : std::true_type {};

template <class T>
struct is_variant : std::false_type {};
template <class... Ts>
struct is_variant<std::variant<Ts...>> : std::true_type {};

template <class T>
inline constexpr bool is_leaf =
    std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_same_v<T, std::string> ||
    std::is_same_v<T, std::string_view> || std::is_same_v<T, const char*>;

/// The inspector: hands every at::Tensor it meets to f(at::Tensor&).
template <class F>
class tensor_walker {
 public:
  using result_type = void;
  static constexpr bool reads_state = true;
  static constexpr bool writes_state = true;

  explicit tensor_walker(F& f) : f_(f) {}

  /// What a type's inspect overload calls with its members.
  template <class... Ts>
  void operator()(Ts&&... xs) {
    (walk(xs), ...);
  }

  template <class T>
  void walk(T& x) {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_same_v<U, at::Tensor>) {
      f_(const_cast<at::Tensor&>(x));
    } else if constexpr (is_leaf<U>) {
      // no tensor inside
    } else if constexpr (is_sequence<U>::value) {
      if constexpr (!is_leaf<typename U::value_type>)  // std::vector<bool> included
        for (auto& e : x) walk(e);
    } else if constexpr (is_mapping<U>::value) {
      for (auto& kv : x) walk(kv.second);
    } else if constexpr (is_ordered_dict<U>::value) {
      for (auto& item : x) walk(item.value());
    } else if constexpr (is_pair_or_tuple<U>::value) {
      std::apply([this](auto&... e) { (walk(e), ...); }, x);
    } else if constexpr (is_maybe<U>::value) {
      if (x.has_value()) walk(*x);
    } else if constexpr (is_variant<U>::value) {
      std::visit([this](auto& e) { walk(e); }, x);
    } else {
      static_assert(
          requires(tensor_walker & w, U & v) { inspect(w, v); },
          "troupe_torch: cannot find the tensors of this type: give it a free function "
          "`template <class Inspector> auto inspect(Inspector& f, T& x) { return "
          "f(x.member1, x.member2); }` (the CAF inspect convention, as for "
          "troupe's serialization)");
      inspect(*this, const_cast<U&>(x));
    }
  }

 private:
  F& f_;
};

}  // namespace detail

/// Calls f(t) for every at::Tensor t in `x` (see the header comment for the
/// types walked), in a fixed order; t may be undefined.
template <class T, class F>
void for_each_tensor(const T& x, F&& f) {
  auto g = [&f](at::Tensor& t) { f(static_cast<const at::Tensor&>(t)); };
  detail::tensor_walker<decltype(g)> w{g};
  w.walk(const_cast<T&>(x));  // g never writes
}

/// Calls f(t) for every at::Tensor t in `x`, in the order for_each_tensor
/// visits them; f may assign a new tensor to t (x changes in place).
template <class T, class F>
void apply_to_tensors(T& x, F&& f) {
  detail::tensor_walker<std::remove_reference_t<F>> w{f};
  w.walk(x);
}

}  // namespace troupe_torch
