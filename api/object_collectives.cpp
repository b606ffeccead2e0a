// Object collectives over bytes: sizes first, then the bytes with the
// variable-size collectives.

#include "troupe/object_collectives.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <numeric>

namespace troupe {

void binary_writer::write_tensor(const tensor& t) {
  if (!t.defined() || !t.is_cpu() || !t.is_contiguous())
    throw error(errc::invalid_argument,
                "serialize: only defined contiguous CPU tensors can be serialized, got " +
                    (t.defined() ? t.describe() : std::string("an undefined tensor")));
  apply(static_cast<std::uint8_t>(t.scalar_type()));
  apply(t.shape());
  size(t.nbytes());
  raw(t.data(), t.nbytes());
}

tensor binary_reader::read_tensor() {
  std::uint8_t code = 0;
  apply(code);
  if (code >= dtype_count) malformed("unknown dtype code " + std::to_string(code));
  shape_t shape;
  apply(shape);
  auto t = tensor::empty(shape, static_cast<dtype>(code));
  auto n = size(1);
  if (n != t.nbytes())
    malformed("tensor data of " + std::to_string(n) + " bytes for " + t.describe());
  raw(t.data(), n);
  return t;
}

namespace detail {

std::string type_name(const std::type_info& t) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name{
      abi::__cxa_demangle(t.name(), nullptr, nullptr, &status), std::free};
  std::string r = status == 0 && name ? name.get() : t.name();
  // The standard library's spelling is long: drop its inline namespaces and
  // the template arguments that are defaults (allocators, comparators,
  // hashers, traits), then name std::string.
  for (const std::string ns : {"std::__cxx11::", "std::__1::"})
    for (auto pos = r.find(ns); pos != std::string::npos; pos = r.find(ns))
      r.replace(pos, ns.size(), "std::");
  for (const std::string arg :
       {", std::allocator<", ", std::less<", ", std::hash<", ", std::equal_to<",
        ", std::char_traits<", ", std::default_delete<"})
    for (auto pos = r.find(arg); pos != std::string::npos; pos = r.find(arg)) {
      // Up to the matching '>' of this argument.
      std::size_t end = pos + arg.size();
      for (int depth = 1; end < r.size() && depth > 0; ++end)
        depth += r[end] == '<' ? 1 : r[end] == '>' ? -1 : 0;
      r.erase(pos, end - pos);
    }
  for (const std::string s : {"std::basic_string<char>", "std::basic_string<char >"})
    for (auto pos = r.find(s); pos != std::string::npos; pos = r.find(s))
      r.replace(pos, s.size(), "std::string");
  // "std::vector<int >" -> "std::vector<int>"
  for (auto pos = r.find(" >"); pos != std::string::npos; pos = r.find(" >")) r.erase(pos, 1);
  return r;
}

namespace {

tensor as_tensor(byte_vector& v) {
  return tensor::from_blob(v.data(), {static_cast<std::int64_t>(v.size())}, dtype::uint8);
}

/// Every rank's byte count.
std::vector<std::int64_t> all_sizes(process_group& pg, std::int64_t mine) {
  auto in = tensor::from_vector<std::int64_t>({mine});
  auto out = tensor::empty({pg.size()}, dtype::int64);
  pg.allgather_into_tensor(out, in).wait();
  return out.to_vector<std::int64_t>();
}

std::vector<byte_vector> split(const byte_vector& all, const std::vector<std::int64_t>& sizes) {
  std::vector<byte_vector> r;
  std::size_t off = 0;
  for (auto s : sizes) {
    r.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(off),
                   all.begin() + static_cast<std::ptrdiff_t>(off + static_cast<std::size_t>(s)));
    off += static_cast<std::size_t>(s);
  }
  return r;
}

}  // namespace

byte_vector broadcast_bytes(process_group& pg, byte_vector data, int root) {
  auto n = tensor::from_vector<std::int64_t>({static_cast<std::int64_t>(data.size())});
  pg.broadcast(n, root).wait();
  data.resize(static_cast<std::size_t>(n.to_vector<std::int64_t>()[0]));
  pg.broadcast(as_tensor(data), root).wait();
  return data;
}

std::vector<byte_vector> all_gather_bytes(process_group& pg, const byte_vector& data) {
  auto sizes = all_sizes(pg, static_cast<std::int64_t>(data.size()));
  byte_vector all(
      static_cast<std::size_t>(std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0})));
  auto mine = data;
  pg.allgatherv(as_tensor(all), as_tensor(mine), sizes).wait();
  return split(all, sizes);
}

std::vector<byte_vector> gather_bytes(process_group& pg, const byte_vector& data, int root) {
  auto sizes = all_sizes(pg, static_cast<std::int64_t>(data.size()));
  byte_vector all(pg.rank() == root ? static_cast<std::size_t>(std::accumulate(
                                          sizes.begin(), sizes.end(), std::int64_t{0}))
                                    : 0);
  auto mine = data;
  pg.gatherv(as_tensor(all), as_tensor(mine), sizes, {.root_rank = root}).wait();
  if (pg.rank() != root) return {};
  return split(all, sizes);
}

byte_vector scatter_bytes(process_group& pg, const std::vector<byte_vector>& data, int root) {
  std::vector<std::int64_t> sizes;
  byte_vector all;
  if (pg.rank() == root) {
    if (static_cast<int>(data.size()) != pg.size())
      throw error(errc::invalid_argument,
                  "scatter_object: the root passed " + std::to_string(data.size()) +
                      " objects for a group of size " + std::to_string(pg.size()));
    for (auto& d : data) {
      sizes.push_back(static_cast<std::int64_t>(d.size()));
      all.insert(all.end(), d.begin(), d.end());
    }
  }
  // Everyone learns every size (the root's list), then takes its bytes.
  auto size_list = tensor::empty({pg.size()}, dtype::int64);
  if (pg.rank() == root) size_list.copy_from(tensor::from_vector<std::int64_t>(sizes));
  pg.broadcast(size_list, root).wait();
  sizes = size_list.to_vector<std::int64_t>();
  byte_vector mine(static_cast<std::size_t>(sizes[static_cast<std::size_t>(pg.rank())]));
  pg.scatterv(as_tensor(mine), as_tensor(all), sizes, {.root_rank = root}).wait();
  return mine;
}

}  // namespace detail
}  // namespace troupe
