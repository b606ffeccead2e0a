#include "troupe/param_sync.hpp"

#include <deque>
#include <utility>

#include "training/tensor_ops.hpp"
#include "troupe/bucket_assignment.hpp"
#include "troupe/error.hpp"
#include "troupe/object_collectives.hpp"

namespace troupe {

namespace {

/// One bucket's broadcast in flight, and how to unpack it.
struct bucket_broadcast {
  work w;
  tensor flat;  // undefined: the tensor went in place
  tensor_list members;
};

bucket_broadcast start_bucket(process_group& pg, const tensor_list& members, int src) {
  if (members.size() == 1) return {pg.broadcast(members[0], src), {}, members};
  std::int64_t total = 0;
  for (auto& t : members) total += t.numel();
  auto flat = tensor::empty({total}, members[0].scalar_type(), members[0].get_device());
  if (pg.rank() == src) {
    std::int64_t off = 0;
    for (auto& t : members) {
      flat.flat_slice(off, t.numel()).copy_from(t);
      off += t.numel();
    }
  }
  return {pg.broadcast(flat, src), flat, members};
}

void finish_bucket(process_group& pg, bucket_broadcast& b, int src) {
  b.w.wait();
  if (!b.flat.defined() || pg.rank() == src) return;
  std::int64_t off = 0;
  for (auto& t : b.members) {
    auto dst = t;
    dst.copy_from(b.flat.flat_slice(off, t.numel()));
    off += t.numel();
  }
}

/// What verify_param_shapes_across_processes compares.
struct param_meta {
  shape_t shape;
  std::uint8_t type = 0;
  std::uint8_t device = 0;
  std::string name;
};

template <class Inspector>
auto inspect(Inspector& f, param_meta& m) {
  return f(m.shape, m.type, m.device, m.name);
}

std::string describe(const param_meta& m) {
  return "sizes " + detail::shape_string(m.shape) + ", dtype " +
         std::string(to_string(static_cast<dtype>(m.type))) + " on " +
         to_string(static_cast<device_type>(m.device));
}

std::string param_label(std::size_t i, const std::string& name) {
  return "params[" + std::to_string(i) + "]" + (name.empty() ? "" : " (" + name + ")");
}

}  // namespace

void broadcast_coalesced(process_group& pg, const tensor_list& tensors, std::size_t bucket_bytes,
                         int src) {
  if (tensors.empty()) return;
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (!tensors[i].defined() || !tensors[i].is_contiguous())
      throw error(errc::invalid_argument,
                  "broadcast_coalesced: tensors[" + std::to_string(i) + "] must be a defined " +
                      "contiguous tensor, got " +
                      (tensors[i].defined() ? tensors[i].describe() : "an undefined tensor"));
  if (bucket_bytes == 0)
    throw error(errc::invalid_argument, "broadcast_coalesced: bucket_bytes must be positive");
  auto assignment = compute_bucket_assignment_by_size(tensors, {bucket_bytes});
  // At most two buckets in flight, as c10d: the flat copies stay bounded.
  std::deque<bucket_broadcast> in_flight;
  for (auto& indices : assignment.buckets) {
    if (in_flight.size() >= 2) {
      finish_bucket(pg, in_flight.front(), src);
      in_flight.pop_front();
    }
    tensor_list members;
    for (auto i : indices) members.push_back(tensors[i]);
    in_flight.push_back(start_bucket(pg, members, src));
  }
  for (auto& b : in_flight) finish_bucket(pg, b, src);
}

void sync_params_and_buffers(process_group& pg, const tensor_list& module_states,
                             std::size_t bucket_bytes, int src) {
  if (!module_states.empty()) broadcast_coalesced(pg, module_states, bucket_bytes, src);
}

void sync_module_states(process_group& pg, const state_dict& parameters, const state_dict& buffers,
                        const sync_module_states_options& opts) {
  tensor_list states;
  for (auto& [name, t] : parameters)
    if (!opts.params_and_buffers_to_ignore.count(name)) states.push_back(t);
  if (opts.broadcast_buffers)
    for (auto& [name, t] : buffers)
      if (!opts.params_and_buffers_to_ignore.count(name)) states.push_back(t);
  sync_params_and_buffers(pg, states, opts.broadcast_bucket_bytes, opts.src);
}

void verify_param_shapes_across_processes(process_group& pg, const tensor_list& params,
                                          const std::vector<std::string>& names) {
  const char* op = "verify_param_shapes_across_processes";
  if (!names.empty() && names.size() != params.size())
    throw error(errc::invalid_argument, std::string(op) + ": " + std::to_string(names.size()) +
                                            " names for " + std::to_string(params.size()) +
                                            " parameters");
  std::vector<param_meta> mine;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined())
      throw error(
          errc::invalid_argument,
          std::string(op) + ": " + param_label(i, names.empty() ? "" : names[i]) + " is undefined");
    mine.push_back({params[i].shape(), static_cast<std::uint8_t>(params[i].scalar_type()),
                    static_cast<std::uint8_t>(params[i].get_device().type),
                    names.empty() ? std::string() : names[i]});
  }
  // Every rank sees every rank's list and compares each with rank 0's: all
  // reach the same verdict.
  auto all = all_gather_object(pg, mine);
  const auto& first = all[0];
  std::string msg;
  for (std::size_t r = 1; r < all.size() && msg.empty(); ++r) {
    const auto& other = all[r];
    if (other.size() != first.size()) {
      msg = "DDP expects same model across all ranks, but rank 0 has " +
            std::to_string(first.size()) + " params, while rank " + std::to_string(r) +
            " has inconsistent " + std::to_string(other.size()) + " params.";
      break;
    }
    for (std::size_t i = 0; i < first.size(); ++i) {
      const auto& a = first[i];
      const auto& b = other[i];
      if (a.shape == b.shape && a.type == b.type && a.device == b.device) continue;
      msg = "rank " + std::to_string(r) + "'s " + param_label(i, b.name) + " has " + describe(b) +
            ", which does not match " + describe(a) + " of the same param on rank 0.";
      break;
    }
  }
  if (!msg.empty()) throw error(errc::mismatch, std::string(op) + ": " + msg);
}

void verify_param_shapes_across_processes(process_group& pg, const state_dict& params) {
  verify_param_shapes_across_processes(pg, params.tensors(), params.names());
}

}  // namespace troupe
