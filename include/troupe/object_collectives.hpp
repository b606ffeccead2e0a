#pragma once
/// Object collectives: broadcast_object, all_gather_object, gather_object and
/// scatter_object for any type serialize() accepts (the CAF inspect
/// convention, see troupe/serialize.hpp).
///
/// Every object travels with the name of its C++ type; a rank that receives an
/// object of another type fails with errc::mismatch naming the rank
/// and both types (the type check of c10d's all_gather_object_with_type_check,
/// done for every object collective). All calls block until done.

#include <string>
#include <typeinfo>
#include <vector>

#include "troupe/process_group.hpp"
#include "troupe/serialize.hpp"

namespace troupe {

namespace detail {
using byte_vector = std::vector<std::uint8_t>;
byte_vector broadcast_bytes(process_group& pg, byte_vector data, int root);
std::vector<byte_vector> all_gather_bytes(process_group& pg, const byte_vector& data);
/// A readable name of a C++ type ("std::string" rather than its mangled form).
std::string type_name(const std::type_info& t);
std::vector<byte_vector> gather_bytes(process_group& pg, const byte_vector& data, int root);
byte_vector scatter_bytes(process_group& pg, const std::vector<byte_vector>& data, int root);

/// An object with its type name.
template <class T>
byte_vector pack_object(const T& x) {
  binary_writer w;
  w.apply(type_name(typeid(T)));
  w.apply(x);
  return std::move(w.bytes());
}

/// The object back, after checking it was sent as a T by `rank`.
template <class T>
T unpack_object(const byte_vector& bytes, const char* op, int rank) {
  binary_reader r{bytes};
  std::string type;
  r.apply(type);
  const auto expected = type_name(typeid(T));
  if (type != expected)
    throw error(errc::mismatch, std::string(op) + ": rank " + std::to_string(rank) +
                                    " sent an object of type '" + type + "', this rank expects '" +
                                    expected + "'");
  T x{};
  r.apply(x);
  return x;
}
}  // namespace detail

/// Replaces `obj` on every rank with the root's.
template <class T>
void broadcast_object(process_group& pg, T& obj, int root = 0) {
  auto bytes = detail::broadcast_bytes(
      pg, pg.rank() == root ? detail::pack_object(obj) : detail::byte_vector{}, root);
  obj = detail::unpack_object<T>(bytes, "broadcast_object", root);
}

/// Every rank's object, in rank order.
template <class T>
std::vector<T> all_gather_object(process_group& pg, const T& obj) {
  auto all = detail::all_gather_bytes(pg, detail::pack_object(obj));
  std::vector<T> r;
  for (std::size_t i = 0; i < all.size(); ++i)
    r.push_back(detail::unpack_object<T>(all[i], "all_gather_object", static_cast<int>(i)));
  return r;
}

/// Every rank's object on the root (in rank order); empty elsewhere.
template <class T>
std::vector<T> gather_object(process_group& pg, const T& obj, int root = 0) {
  auto all = detail::gather_bytes(pg, detail::pack_object(obj), root);
  std::vector<T> r;
  for (std::size_t i = 0; i < all.size(); ++i)
    r.push_back(detail::unpack_object<T>(all[i], "gather_object", static_cast<int>(i)));
  return r;
}

/// Rank r receives objs[r] from the root (objs is read on the root only and
/// must hold one object per rank).
template <class T>
T scatter_object(process_group& pg, const std::vector<T>& objs, int root = 0) {
  std::vector<detail::byte_vector> packed;
  if (pg.rank() == root)
    for (auto& o : objs) packed.push_back(detail::pack_object(o));
  return detail::unpack_object<T>(detail::scatter_bytes(pg, packed, root), "scatter_object", root);
}

}  // namespace troupe
