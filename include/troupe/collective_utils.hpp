#pragma once
/// Collective utilities (torch.distributed.collective_utils): run a function on
/// one rank or on every rank and share its result, so that a failure anywhere
/// makes every rank throw instead of leaving some of them waiting.
///
///   // rank 0 allocates, every rank gets the id; if allocate_id throws, all throw
///   auto id = collective_utils::broadcast(allocate_id, {.stage_name = "alloc", .pg = &pg});
///   // every rank probes; every rank gets all results, or all throw naming who failed
///   auto ports = collective_utils::all_gather(probe_port, {.stage_name = "probe", .pg = &pg});
///
/// Payloads are any type the object collectives carry (troupe/serialize.hpp).
/// Every rank passes the same stage name; a rank with another one makes every
/// rank throw errc::mismatch naming it. A failure (an exception in the
/// function, or success = false on the broadcasting rank) makes every rank
/// throw errc::aborted with the seed's text: "Rank R failed: stage S:
/// exception E". Without a group (pg == nullptr) both run locally, as the
/// seed's pg=None paths. All calls block until done.

#include <concepts>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "troupe/object_collectives.hpp"
#include "troupe/process_group.hpp"
#include "troupe/serialize.hpp"

namespace troupe::collective_utils {

/// The seed's keyword arguments of broadcast.
struct broadcast_options {
  /// false on the broadcasting rank stops every rank (pass no data then).
  bool success = true;
  /// The logical stage, checked across ranks and named in errors.
  std::optional<std::string> stage_name = std::nullopt;
  /// The rank that runs the function (or whose data is sent).
  int rank = 0;
  /// The group; nullptr runs locally (then rank must be 0).
  process_group* pg = nullptr;
};

/// The seed's keyword arguments of all_gather.
struct all_gather_options {
  std::optional<std::string> stage_name = std::nullopt;
  process_group* pg = nullptr;
};

/// How all_gather_object_enforce_type compares objects: `same(first, other)`
/// says whether `other` has the type of rank 0's object, `name(x)` names x's
/// type in the error. Empty members: the C++ types must match (the default).
template <class T>
struct type_checker {
  std::function<bool(const T&, const T&)> same;
  std::function<std::string(const T&)> name;
};

namespace detail {
using troupe::detail::byte_vector;

/// A rank's result: its payload (serialized), or why it has none.
struct outcome {
  bool success = true;
  std::optional<byte_vector> payload;
  std::string exception;  // empty: none
};

/// Runs fn and serializes its result; an exception becomes a failed outcome.
template <class F>
outcome run_guarded(F& fn) {
  outcome o;
  try {
    o.payload = serialize(fn());
  } catch (const std::exception& e) {
    o = {false, std::nullopt, e.what()};
  } catch (...) {
    o = {false, std::nullopt, "unknown exception"};
  }
  return o;
}

/// The broadcasting rank's payload on every rank, or the seed's failure on every rank.
byte_vector broadcast_outcome(const std::string& type, outcome mine, const broadcast_options& o);
/// Every rank's payload, or one error on every rank naming every failing rank.
std::vector<byte_vector> all_gather_outcomes(const std::string& type, outcome mine,
                                             const all_gather_options& o);
/// Every rank's bytes; all throw the seed's type message when a C++ type differs from rank 0's.
std::vector<byte_vector> all_gather_typed(process_group& pg, const std::string& type,
                                          byte_vector payload);
/// "Object type at index i is <type>, while first object type is <first>" (errc::mismatch).
[[noreturn]] void throw_type_mismatch(std::size_t index, const std::string& type,
                                      const std::string& first);
/// The checks the seed makes before any communication.
void check_broadcast_args(bool has_data, const broadcast_options& o);

template <class T>
std::string type_of() {
  return troupe::detail::type_name(typeid(T));
}
}  // namespace detail

/// Broadcasts `data` from rank o.rank to every rank and returns it (the data
/// other ranks pass is ignored). errc::invalid_argument with "Data or Function
/// is expected to be None if not successful" when o.success is false.
template <class T>
requires(!std::invocable<T&>) T broadcast(const T& data, const broadcast_options& o = {}) {
  detail::check_broadcast_args(true, o);
  detail::outcome mine;
  mine.payload = serialize(data);
  return deserialize<T>(detail::broadcast_outcome(detail::type_of<T>(), std::move(mine), o));
}

/// Runs `fn` on rank o.rank and returns its result on every rank; if it
/// throws, every rank throws "Rank R failed: stage S: exception E".
template <class F>
requires std::invocable<F&> std::invoke_result_t<F&> broadcast(F&& fn,
                                                               const broadcast_options& o = {}) {
  using R = std::decay_t<std::invoke_result_t<F&>>;
  detail::check_broadcast_args(true, o);
  const bool runs_here = o.pg ? o.pg->rank() == o.rank : o.rank == 0;
  auto mine = runs_here ? detail::run_guarded(fn) : detail::outcome{};
  return deserialize<R>(detail::broadcast_outcome(detail::type_of<R>(), std::move(mine), o));
}

/// Takes part without data: on the broadcasting rank with o.success = false
/// this stops every rank ("Rank R failed: stage S"); elsewhere it receives the
/// broadcasting rank's T.
template <class T>
T broadcast(std::nullopt_t, const broadcast_options& o = {}) {
  detail::check_broadcast_args(false, o);
  return deserialize<T>(detail::broadcast_outcome(detail::type_of<T>(), {o.success, {}, {}}, o));
}

/// Every rank's `data`, in rank order.
template <class T>
requires(!std::invocable<T&>) std::vector<T> all_gather(const T& data,
                                                        const all_gather_options& o = {}) {
  detail::outcome mine;
  mine.payload = serialize(data);
  std::vector<T> r;
  for (auto& b : detail::all_gather_outcomes(detail::type_of<T>(), std::move(mine), o))
    r.push_back(deserialize<T>(b));
  return r;
}

/// Runs `fn` on every rank and returns every rank's result in rank order; if
/// it throws anywhere, every rank throws one error naming every failing rank
/// and its exception.
template <class F>
requires std::invocable<F&> std::vector<std::decay_t<std::invoke_result_t<F&>>> all_gather(
    F&& fn, const all_gather_options& o = {}) {
  using R = std::decay_t<std::invoke_result_t<F&>>;
  std::vector<R> r;
  for (auto& b : detail::all_gather_outcomes(detail::type_of<R>(), detail::run_guarded(fn), o))
    r.push_back(deserialize<R>(b));
  return r;
}

/// all_gather_object with a type check after the gather: every rank throws
/// errc::mismatch "Object type at index i is X, while first object type is Y"
/// when rank i's object differs in type from rank 0's — by C++ type always,
/// and by `check.same` when given (e.g. the kind tag of a message struct).
template <class T>
std::vector<T> all_gather_object_enforce_type(process_group& pg, const T& obj,
                                              const type_checker<T>& check = {}) {
  std::vector<T> all;
  for (auto& b : detail::all_gather_typed(pg, detail::type_of<T>(), serialize(obj)))
    all.push_back(deserialize<T>(b));
  if (check.same) {
    auto name = [&](const T& x) { return check.name ? check.name(x) : detail::type_of<T>(); };
    for (std::size_t i = 1; i < all.size(); ++i)
      if (!check.same(all[0], all[i])) detail::throw_type_mismatch(i, name(all[i]), name(all[0]));
  }
  return all;
}

}  // namespace troupe::collective_utils
