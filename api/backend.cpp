// backend: default implementations, the registry of backends by name, and
// backend strings.

#include "troupe/backend.hpp"

#include "backends/builtin_backends.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>

#include "troupe/error.hpp"

namespace troupe {

void backend::unsupported(const char* op) const {
  throw error(errc::backend, "backend '" + name() + "' does not support " + op);
}

// clang-format off
work backend::broadcast(tensor_list&, const broadcast_options&) { unsupported("broadcast"); }
work backend::allreduce(tensor_list&, const allreduce_options&) { unsupported("allreduce"); }
work backend::allreduce_coalesced(tensor_list&, const allreduce_coalesced_options&) { unsupported("allreduce_coalesced"); }
work backend::reduce(tensor_list&, const reduce_options&) { unsupported("reduce"); }
work backend::allgather(std::vector<tensor_list>&, tensor_list&, const allgather_options&) { unsupported("allgather"); }
work backend::allgather_into_tensor(tensor&, tensor&, const allgather_options&) { unsupported("allgather_into_tensor"); }
work backend::allgather_coalesced(std::vector<tensor_list>&, tensor_list&, const allgather_options&) { unsupported("allgather_coalesced"); }
work backend::allgather_into_tensor_coalesced(tensor_list&, tensor_list&, const allgather_options&) { unsupported("allgather_into_tensor_coalesced"); }
work backend::gather(std::vector<tensor_list>&, tensor_list&, const gather_options&) { unsupported("gather"); }
work backend::scatter(tensor_list&, std::vector<tensor_list>&, const scatter_options&) { unsupported("scatter"); }
work backend::reduce_scatter(tensor_list&, std::vector<tensor_list>&, const reduce_scatter_options&) { unsupported("reduce_scatter"); }
work backend::reduce_scatter_tensor(tensor&, tensor&, const reduce_scatter_options&) { unsupported("reduce_scatter_tensor"); }
work backend::reduce_scatter_tensor_coalesced(tensor_list&, tensor_list&, const reduce_scatter_options&) { unsupported("reduce_scatter_tensor_coalesced"); }
work backend::alltoall_single(tensor&, tensor&, const std::vector<std::int64_t>&, const std::vector<std::int64_t>&, const alltoall_options&) { unsupported("alltoall_single"); }
work backend::alltoall(tensor_list&, tensor_list&, const alltoall_options&) { unsupported("alltoall"); }
work backend::barrier(const barrier_options&) { unsupported("barrier"); }
work backend::monitored_barrier(const monitored_barrier_options&) { unsupported("monitored_barrier"); }
work backend::send(tensor_list&, int, const p2p_options&) { unsupported("send"); }
work backend::recv(tensor_list&, int, const p2p_options&) { unsupported("recv"); }
work backend::recv_any_source(tensor_list&, const p2p_options&) { unsupported("recv_any_source"); }
work backend::allgatherv(tensor&, tensor&, const std::vector<std::int64_t>&, const allgather_options&) { unsupported("allgatherv"); }
work backend::gatherv(tensor&, tensor&, const std::vector<std::int64_t>&, const gather_options&) { unsupported("gatherv"); }
work backend::scatterv(tensor&, tensor&, const std::vector<std::int64_t>&, const scatter_options&) { unsupported("scatterv"); }
work backend::reduce_scatterv(tensor&, tensor&, const std::vector<std::int64_t>&, const reduce_scatter_options&) { unsupported("reduce_scatterv"); }
// clang-format on

work backend::broadcast_one(tensor& t, const broadcast_options& o) {
  tensor_list one{t};
  return broadcast(one, o);
}

work backend::allreduce_one(tensor& t, const allreduce_options& o) {
  tensor_list one{t};
  return allreduce(one, o);
}

work backend::reduce_one(tensor& t, const reduce_options& o) {
  tensor_list one{t};
  return reduce(one, o);
}

work backend::gather_one(tensor_list& outs, tensor& in, const gather_options& o) {
  std::vector<tensor_list> lists;
  if (!outs.empty()) lists.push_back(std::move(outs));
  tensor_list one{in};
  return gather(lists, one, o);
}

work backend::scatter_one(tensor& out, tensor_list& ins, const scatter_options& o) {
  std::vector<tensor_list> lists;
  if (!ins.empty()) lists.push_back(std::move(ins));
  tensor_list one{out};
  return scatter(one, lists, o);
}

work backend::send_one(tensor& t, int dst, const p2p_options& o) {
  tensor_list one{t};
  return send(one, dst, o);
}

work backend::recv_one(tensor& t, int src, const p2p_options& o) {
  tensor_list one{t};
  return recv(one, src, o);
}

work backend::recv_any_source_one(tensor& t, const p2p_options& o) {
  tensor_list one{t};
  return recv_any_source(one, o);
}

work backend::batch_isend_irecv(std::vector<p2p_op>& ops) {
  std::vector<work> parts;
  parts.reserve(ops.size());
  for (auto& op : ops) {
    const p2p_options o{.tag = op.tag};
    parts.push_back(op.kind == p2p_op::isend ? send_one(op.buffer, op.peer, o)
                                             : recv_one(op.buffer, op.peer, o));
  }
  return work::when_all("batch_isend_irecv", group_name(), std::move(parts));
}

const char* to_string(backend_type t) noexcept {
  switch (t) {
    case backend_type::undefined:
      return "undefined";
    case backend_type::actor:
      return "actor";
    case backend_type::nccl:
      return "nccl";
    case backend_type::custom:
      return "custom";
  }
  return "unknown";
}

namespace {

/// Backend names are case-insensitive (as c10d's): kept in lower case.
std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

backend_type backend_type_of(const std::string& name) {
  const auto n = lower(name);
  if (n.empty()) return backend_type::undefined;
  if (n == "actor") return backend_type::actor;
  if (n == "nccl") return backend_type::nccl;
  return backend_type::custom;
}

std::uint64_t backend::sequence_number() {
  return 0;
}
void backend::abort(const std::string&) {}

// -- the registry -----------------------------------------------------------------

namespace detail {

struct registry {
  std::mutex mtx;
  std::map<std::string, registry_entry> entries;
};

registry& the_registry() {
  static registry r;
  static std::once_flag once;
  std::call_once(once, [] { r.entries = builtin_backends(); });
  return r;
}

/// The creator of `name` (throws errc::backend listing the available ones).
backend_creator find_backend(const std::string& name) {
  auto& r = the_registry();
  std::lock_guard<std::mutex> g{r.mtx};
  auto i = r.entries.find(lower(name));
  if (i == r.entries.end()) {
    std::string known;
    for (auto& kv : r.entries) known += (known.empty() ? "" : ", ") + kv.first;
    throw error(errc::backend,
                "backend '" + name + "' is not registered (available: " + known + ")");
  }
  return i->second.creator;
}

}  // namespace detail

void register_backend(const std::string& name, backend_creator creator,
                      std::vector<device_type> devices) {
  if (name.empty() || name.find_first_of(":,") != std::string::npos)
    throw error(errc::invalid_argument, "register_backend: invalid backend name '" + name +
                                            "' (empty or contains ':' or ',')");
  if (!creator)
    throw error(errc::invalid_argument, "register_backend: no creator for '" + name + "'");
  if (devices.empty())
    throw error(errc::invalid_argument, "register_backend: no device types for '" + name + "'");
  auto& r = detail::the_registry();
  std::lock_guard<std::mutex> g{r.mtx};
  if (!r.entries
           .emplace(lower(name), detail::registry_entry{std::move(creator), std::move(devices)})
           .second)
    throw error(errc::invalid_argument, "register_backend: backend '" + name +
                                            "' already registered (names ignore letter case)");
}

bool is_backend_available(const std::string& name) {
  auto& r = detail::the_registry();
  std::lock_guard<std::mutex> g{r.mtx};
  return r.entries.count(lower(name)) != 0;
}

std::vector<std::string> available_backends() {
  auto& r = detail::the_registry();
  std::lock_guard<std::mutex> g{r.mtx};
  std::vector<std::string> names;
  for (auto& kv : r.entries) names.push_back(kv.first);
  return names;
}

// -- backend strings -----------------------------------------------------------------

namespace {

device_type parse_device(const std::string& spec, const std::string& d) {
  if (d == "cpu") return device_type::cpu;
  if (d == "cuda") return device_type::cuda;
  throw error(errc::invalid_argument, "backend_config: unknown device '" + d + "' in '" + spec +
                                          "' (expected cpu or cuda)");
}

}  // namespace

backend_config::backend_config(const std::string& given) {
  const std::string spec = lower(given);  // c10d: "DUMMY" and "dummy" are one backend
  auto bad = [&](const std::string& why) {
    throw error(errc::invalid_argument,
                "backend_config: invalid backend string '" + given + "': " + why);
  };
  if (spec.empty()) bad("empty");
  if (spec.find(':') == std::string::npos) {
    if (spec.find(',') != std::string::npos)
      bad("several backends need device prefixes (cpu:NAME,cuda:NAME)");
    // A single name: every device it registered ("actor" registers cpu and cuda).
    auto& r = detail::the_registry();
    std::lock_guard<std::mutex> g{r.mtx};
    auto i = r.entries.find(spec);
    if (i == r.entries.end()) {
      std::string known;
      for (auto& kv : r.entries) known += (known.empty() ? "" : ", ") + kv.first;
      bad("backend '" + spec + "' is not registered (available: " + known + ")");
    }
    for (auto d : i->second.devices) entries_.emplace_back(d, spec);
    return;
  }
  if (spec.back() == ',') bad("trailing comma");
  std::size_t start = 0;
  while (start <= spec.size()) {
    auto end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    auto part = spec.substr(start, end - start);
    auto colon = part.find(':');
    if (part.empty()) bad("empty entry");
    if (colon == std::string::npos) bad("entry '" + part + "' has no device prefix");
    auto d = parse_device(spec, part.substr(0, colon));
    auto name = part.substr(colon + 1);
    if (name.empty()) bad("entry '" + part + "' names no backend");
    for (auto& e : entries_)
      if (e.first == d) bad("device '" + std::string(troupe::to_string(d)) + "' appears twice");
    entries_.emplace_back(d, name);
    start = end + 1;
  }
}

std::string backend_config::backend_for(device_type d) const {
  for (auto& e : entries_)
    if (e.first == d) return e.second;
  return {};
}

std::string backend_config::to_string() const {
  std::string r;
  for (auto& e : entries_)
    r += (r.empty() ? "" : ",") + std::string(troupe::to_string(e.first)) + ":" + e.second;
  return r;
}

}  // namespace troupe
