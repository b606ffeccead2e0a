// distributed_data_parallel's logging data (troupe_torch/ddp_logging.hpp):
// what c10d::Logger fills at construction and samples at the start of a
// synchronised forward, with torch's keys and formats.

#include "troupe_torch/ddp_logging.hpp"

#include <chrono>
#include <cstdlib>
#include <set>
#include <sstream>

#include "ddp_state.hpp"
#include "troupe/error.hpp"
#include "troupe_torch/sync_batch_norm.hpp"

namespace troupe_torch {
namespace {

template <class T>
std::string join(const std::vector<T>& xs, const char* sep) {
  std::ostringstream s;
  for (std::size_t i = 0; i < xs.size(); ++i) s << (i ? sep : "") << xs[i];
  return s.str();
}

std::string env_or_na(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "N/A";
}

/// "torch::nn::SequentialImpl" -> "Sequential"; "(anonymous namespace)::NetImpl" -> "Net".
std::string class_name(const std::string& full) {
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i + 1 < full.size(); ++i) {
    if (full[i] == '<' || full[i] == '(') ++depth;
    if (full[i] == '>' || full[i] == ')') --depth;
    if (depth == 0 && full[i] == ':' && full[i + 1] == ':') start = i + 2;
  }
  auto r = full.substr(start);
  const std::string suffix = "Impl";
  if (r.size() > suffix.size() && r.compare(r.size() - suffix.size(), suffix.size(), suffix) == 0)
    r.resize(r.size() - suffix.size());
  return r;
}

}  // namespace

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::vector<std::int64_t> ddp_engine::impl::bucket_bytes() const {
  std::vector<std::int64_t> r;
  for (const auto& b : red->bucket_indices()) {
    std::int64_t bytes = 0;
    for (auto i : b)
      bytes += params[i].numel() * static_cast<std::int64_t>(params[i].element_size());
    r.push_back(bytes);
  }
  return r;
}

void ddp_engine::impl::log_construction() {
  auto& d = log.data;
  d.world_size = pg.size();
  d.rank = pg.rank();
  d.module_name = class_name(module->name());
  d.broadcast_buffers = opts.broadcast_buffers;
  for (const auto& m : module->modules())
    if (dynamic_cast<const SyncBatchNormImpl*>(m.get())) d.has_sync_bn = true;
  d.bucket_cap_bytes = static_cast<std::int64_t>(opts.bucket_cap_bytes);
  d.find_unused_parameters = opts.find_unused_parameters;
  d.gradient_as_bucket_view = opts.gradient_as_bucket_view;
  d.static_graph = opts.static_graph;
  d.backend_name = pg.backend_name();
  d.num_parameter_tensors = static_cast<std::int64_t>(params.size());
  std::set<std::string> dtypes;
  for (const auto& p : params) {
    d.total_parameter_size_bytes += p.numel() * static_cast<std::int64_t>(p.element_size());
    dtypes.insert(std::string(p.dtype().name()));
  }
  d.dtypes.assign(dtypes.begin(), dtypes.end());
  d.bucket_sizes = bucket_bytes();
  for (const auto& [key, var] : {std::pair{"master_port", "MASTER_PORT"},
                                 {"master_addr", "MASTER_ADDR"},
                                 {"torch_distributed_debug", "TORCH_DISTRIBUTED_DEBUG"},
                                 {"cuda_visible_devices", "CUDA_VISIBLE_DEVICES"}})
    d.env[key] = env_or_na(var);
}

bool ddp_engine::impl::should_collect() const {
  return iterations > 0 && (iterations <= 10 || iterations % log.sample_rate == 0);
}

void ddp_engine::impl::record(ddp_event e) {
  log.events[static_cast<std::size_t>(e)] = now_ns();
}

void ddp_engine::impl::sample() {
  if (!should_collect()) return;
  auto& d = log.data;
  const auto n = ++log.samples;
  d.iteration = iterations;
  if (log.unused.empty() && opts.find_unused_parameters) d.unused_parameter_size = 0;
  for (auto i : log.unused)
    d.unused_parameter_size =
        d.unused_parameter_size.value_or(0) +
        params[i].numel() * static_cast<std::int64_t>(params[i].element_size());
  // torch rebuilds at the first forward after the iteration that gave the
  // order, after that forward's sample.
  const bool rebuilt = log.rebuilt_at > 0 && iterations > log.rebuilt_at;
  if (rebuilt != d.has_rebuilt_buckets.value_or(false)) {
    d.rebuilt_bucket_sizes = bucket_bytes();
    d.rebuilt_per_bucket_param_indices = red->bucket_indices();
  }
  d.has_rebuilt_buckets = rebuilt;
  if (!log.ready_order.empty()) d.prev_iteration_grad_ready_order_indices = log.ready_order;

  // The sampled iteration's times (torch's CPU timer: an event not recorded
  // counts as -1, and a difference that is negative is left out).
  d.has_runtime_stats = true;
  const auto& ev = log.events;
  auto at = [&ev](ddp_event e) { return ev[static_cast<std::size_t>(e)]; };
  auto average = [n](std::int64_t& avg, std::int64_t& now, std::int64_t start, std::int64_t end) {
    now = 0;
    if (end < start) return;
    now = end - start;
    avg = (now + avg * (n - 1)) / n;
  };
  average(d.avg_forward_compute_time, d.forward_compute_time, at(ddp_event::forward_start),
          at(ddp_event::backward_compute_start));
  average(d.avg_backward_compute_time, d.backward_compute_time,
          at(ddp_event::backward_compute_start), at(ddp_event::backward_compute_end));
  average(d.avg_backward_comm_time, d.backward_comm_time, at(ddp_event::backward_comm_start),
          at(ddp_event::backward_comm_end));
  average(d.avg_backward_compute_comm_overlap_time, d.backward_compute_comm_overlap_time,
          at(ddp_event::backward_comm_start), at(ddp_event::backward_compute_end));
  auto stamp = [&at](ddp_event e) { return at(e) < 0 ? 0 : at(e); };
  d.forward_compute_time_start = stamp(ddp_event::forward_start);
  d.backward_compute_time_start = stamp(ddp_event::backward_compute_start);
  d.backward_comm_time_start = stamp(ddp_event::backward_comm_start);
  d.backward_compute_time_end = stamp(ddp_event::backward_compute_end);
  d.backward_comm_time_end = stamp(ddp_event::backward_comm_end);
}

void ddp_engine::impl::log_error(const std::string& what) {
  log.data.has_error = true;
  log.data.error = what;
  log.data.iteration = iterations;
}

ddp_logging_data ddp_engine::logging_data() const {
  return impl_->log.data;
}

void ddp_engine::set_ddp_runtime_logging_sample_rate(int rate) {
  if (rate < 1)
    throw troupe::error(troupe::errc::invalid_argument,
                        "distributed_data_parallel.set_ddp_runtime_logging_sample_rate: DDP "
                        "runtime logging sample rate should be equal or greater than 1, got " +
                            std::to_string(rate));
  impl_->log.sample_rate = rate;
}

std::map<std::string, std::string> ddp_logging_data::strs_map() const {
  std::map<std::string, std::string> r = env;
  r["module_name"] = module_name;
  r["device_ids"] = join(device_ids, ", ");
  r["backend_name"] = backend_name;
  r["dtypes"] = join(dtypes, ", ");
  r["bucket_sizes"] = join(bucket_sizes, ", ");
  if (!comm_hook.empty()) r["comm_hook"] = comm_hook;
  if (!rebuilt_bucket_sizes.empty()) {
    r["rebuilt_bucket_sizes"] = join(rebuilt_bucket_sizes, ", ");
    std::vector<std::string> per_bucket;
    for (const auto& b : rebuilt_per_bucket_param_indices) per_bucket.push_back(join(b, " "));
    r["rebuilt_per_bucket_param_indices"] = join(per_bucket, ", ");
  }
  if (!prev_iteration_grad_ready_order_indices.empty())
    r["prev_iteration_grad_ready_order_indices"] =
        join(prev_iteration_grad_ready_order_indices, ", ");
  if (has_error) r["error"] = error;
  return r;
}

std::map<std::string, std::int64_t> ddp_logging_data::ints_map() const {
  std::map<std::string, std::int64_t> r{
      {"world_size", world_size},
      {"rank", rank},
      {"output_device", output_device},
      {"broadcast_buffers", broadcast_buffers},
      {"has_sync_bn", has_sync_bn},
      {"bucket_cap_bytes", bucket_cap_bytes},
      {"find_unused_parameters", find_unused_parameters},
      {"gradient_as_bucket_view", gradient_as_bucket_view},
      {"is_multi_device_module", is_multi_device_module},
      {"num_parameter_tensors", num_parameter_tensors},
      {"total_parameter_size_bytes", total_parameter_size_bytes},
      {"iteration", iteration},
  };
  if (static_graph) r["static_graph"] = 1;
  if (join_uneven_inputs) r["join_uneven_inputs"] = 1;
  if (has_rebuilt_buckets) r["has_rebuilt_buckets"] = *has_rebuilt_buckets;
  if (unused_parameter_size) r["unused_parameter_size"] = *unused_parameter_size;
  if (has_runtime_stats) {
    r["forward_compute_time"] = forward_compute_time;
    r["backward_compute_time"] = backward_compute_time;
    r["backward_comm_time"] = backward_comm_time;
    r["backward_compute_comm_overlap_time"] = backward_compute_comm_overlap_time;
    r["avg_forward_compute_time"] = avg_forward_compute_time;
    r["avg_backward_compute_time"] = avg_backward_compute_time;
    r["avg_backward_comm_time"] = avg_backward_comm_time;
    r["avg_backward_compute_comm_overlap_time"] = avg_backward_compute_comm_overlap_time;
    r["forward_compute_time_start"] = forward_compute_time_start;
    r["backward_compute_time_start"] = backward_compute_time_start;
    r["backward_comm_time_start"] = backward_comm_time_start;
    r["backward_compute_time_end"] = backward_compute_time_end;
    r["backward_comm_time_end"] = backward_comm_time_end;
  }
  if (has_error) r["has_error"] = 1;
  return r;
}

}  // namespace troupe_torch
