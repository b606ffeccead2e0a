// distributed_data_parallel::join: uneven inputs as torch's Join context with
// DDP's join hook (torch/distributed/algorithms/join.py, _DDPJoinHook).
//
// Terms: a rank *trains* while its own loop runs and has *joined* once it
// ended. Every forward of a training rank issues, on the group:
//   1. notify    allreduce of 1 (the number of ranks still training; kept
//                as the divisor when not dividing by the group's size);
//   2. check     with throw_on_early_termination: allreduce of 0, nonzero
//                when a joined rank asks everyone to stop;
//   3. buffers   when the forward broadcasts buffers: the highest training
//                rank (allreduce MAX), then the broadcast from it;
//   4. sync?     allreduce of 1 when its backward synchronises, else 0;
//   5. backward  the reducer's step (buckets, used bitmap, first rebuild).
// A joined rank answers each such forward with the same collectives: 0 for
// (1) (all zeros: every rank joined, the loop ends), 1 for (2) then throws,
// -1 as its rank for (3), 0 for (4), and for (5), when (4) said so, a
// reducer step in which every parameter contributes zeros. At the end the
// highest rank among the last to join gives every rank its parameters and
// buffers.

#include <unordered_set>

#include "ddp_state.hpp"
#include "troupe/error.hpp"
#include "troupe/param_sync.hpp"
#include "troupe_torch/tensor.hpp"

namespace troupe_torch {
namespace {

float allreduce_sum(troupe::process_group& pg, float v) {
  auto t = troupe::tensor::from_vector<float>({v});
  pg.allreduce(t).wait();
  return t.to_vector<float>()[0];
}

std::int64_t allreduce_max(troupe::process_group& pg, std::int64_t v) {
  auto t = troupe::tensor::from_vector<std::int64_t>({v});
  pg.allreduce(t, troupe::reduce_op::MAX).wait();
  return t.to_vector<std::int64_t>()[0];
}

void finish_work(troupe::work& w) {
  if (w.valid()) w.wait();
  w = troupe::work{};
}

}  // namespace

void ddp_engine::impl::join_before_forward() {
  finish_work(join.requires_sync_work);
  finish_work(join.notify);
  join.notify_count = troupe::tensor::from_vector<float>({1.0f});
  join.notify = pg.allreduce(join.notify_count);
  if (join.opts.throw_on_early_termination && allreduce_sum(pg, 0.0f) != 0.0f)
    throw troupe::error(troupe::errc::aborted,
                        "distributed_data_parallel.join: Detected at least one rank that "
                        "exhausted inputs. Throwing across all ranks.");
}

int ddp_engine::impl::buffer_source() {
  const auto r = allreduce_max(pg, join.active ? pg.rank() : -1);
  if (r < 0)
    throw troupe::error(troupe::errc::internal,
                        "distributed_data_parallel.join: no rank is still training to take the "
                        "buffers from");
  return static_cast<int>(r);
}

double ddp_engine::impl::join_scale() {
  if (!join.active || join.opts.divide_by_initial_world_size || has_hook || !join.notify.valid())
    return 1.0;
  join.notify.wait();
  const float training = join.notify_count.to_vector<float>()[0];
  return training > 0 ? static_cast<double>(pg.size()) / training : 1.0;
}

void ddp_engine::impl::shadow_iteration() {
  if (will_sync_buffers()) {
    const auto src = allreduce_max(pg, -1);
    if (src < 0)
      throw troupe::error(troupe::errc::internal,
                          "distributed_data_parallel.join: no rank is still training to take "
                          "the buffers from");
    sync_buffers(static_cast<int>(src));
  }
  const bool synchronises = allreduce_sum(pg, 0.0f) != 0.0f;
  require_forward_param_sync = synchronises;
  if (synchronises) shadow_step();
}

void ddp_engine::impl::shadow_step() {
  // A zero gradient of each parameter's dtype and size: views of one buffer per dtype.
  auto zero_for = [this](std::size_t i) {
    const auto& g = red->gradient(i);
    for (auto& z : join.zeros)
      if (z.scalar_type() == g.scalar_type() && z.numel() >= g.numel())
        return z.flat_slice(0, g.numel());
    join.zeros.push_back(troupe::tensor::zeros({g.numel()}, g.scalar_type()));
    return join.zeros.back();
  };
  if (opts.static_graph) {
    // The first step records who is used: marking none, this rank uses none.
    if (static_first())
      static_marks.assign(params.size(), 0);
    else
      for (std::size_t i = 0; i < params.size(); ++i)
        for (int k = 0; k < static_marks[i]; ++k) red->mark_ready(i, zero_for(i));
  } else if (opts.find_unused_parameters) {
    for (std::size_t i = 0; i < params.size(); ++i) red->mark_unused(i);
  } else {
    for (std::size_t i = 0; i < params.size(); ++i) red->mark_ready(i, zero_for(i));
  }
  finish(1.0);
}

void ddp_engine::join(const std::function<void()>& train, const join_options& options) {
  auto& s = *impl_;
  if (!options.enable) {
    train();
    return;
  }
  if (s.join.active)
    throw troupe::error(troupe::errc::invalid_argument,
                        "distributed_data_parallel.join: already inside a join()");
  s.join.active = true;
  s.join.opts = options;
  s.log.data.join_uneven_inputs = true;
  struct leave {
    impl& s;
    ~leave() {
      s.join.active = false;
      s.join.notify = troupe::work{};
      s.join.requires_sync_work = troupe::work{};
    }
  } guard{s};

  train();  // an exception leaves at once, as torch's context does
  finish_work(s.join.requires_sync_work);
  finish_work(s.join.notify);

  // Shadow the ranks still training, one of their forwards at a time.
  bool last_to_join = true;
  while (allreduce_sum(s.pg, 0.0f) != 0.0f) {
    if (options.throw_on_early_termination) {
      allreduce_sum(s.pg, 1.0f);
      throw troupe::error(troupe::errc::aborted, "distributed_data_parallel.join: Rank " +
                                                     std::to_string(s.pg.rank()) +
                                                     " exhausted all inputs.");
    }
    s.shadow_iteration();
    last_to_join = false;
  }

  // Every rank takes the model of the highest rank among the last to join.
  const auto src = allreduce_max(s.pg, last_to_join ? s.pg.rank() : -1);
  std::vector<at::Tensor> states;
  std::unordered_set<const void*> seen;
  for (const auto& named : {s.module->named_parameters(), s.module->named_buffers()})
    for (const auto& item : named)
      if (!s.opts.params_and_buffers_to_ignore.count(item.key()) && item.value().defined() &&
          seen.insert(item.value().unsafeGetTensorImpl()).second)
        states.push_back(item.value());
  troupe::tensor_list ts;
  for (const auto& t : states) ts.push_back(to_troupe_dense(t.detach(), "join", "a state"));
  troupe::sync_params_and_buffers(s.pg, ts, s.opts.broadcast_bucket_bytes, static_cast<int>(src));
}

}  // namespace troupe_torch
