#pragma once
// The state of a distributed_data_parallel (ddp_engine::impl) and the parts
// that work on it: the steps (distributed_data_parallel.cpp), the logging
// data (ddp_logging.cpp) and uneven inputs (ddp_join.cpp).
//
// Terms: a *synchronised* forward runs with grad mode on outside no_sync;
// its backward is a *step* of the reducer. A step begins at the first of its
// gradients' hooks or at the backward of DDP's sink node on the forward's
// output (whichever comes first: both run in the outermost backward before
// any reentrant one), which queues the step's end on that backward; the end
// waits for the reducer's buckets and puts the averages into .grad.

#include <torch/csrc/autograd/function.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/reducer.hpp"
#include "troupe/work.hpp"
#include "troupe_torch/distributed_data_parallel.hpp"

namespace troupe_torch {

/// Nanoseconds since the epoch on the system clock (torch's CPU timer).
std::int64_t now_ns();

/// Runtime events of a synchronised iteration (torch's Timer::Event).
enum class ddp_event : std::size_t {
  forward_start,
  backward_compute_start,
  backward_comm_start,
  backward_compute_end,
  backward_comm_end,
};

struct ddp_log_state {
  ddp_logging_data data;
  int sample_rate = 100;
  std::int64_t samples = 0;                                // iterations whose stats were taken
  std::array<std::int64_t, 5> events{-1, -1, -1, -1, -1};  // this iteration's, -1: not recorded
  std::vector<std::size_t> ready_order;  // hooks fired in the last synchronised backward
  std::vector<std::size_t> unused;       // parameters the last forward did not reach
  std::int64_t rebuilt_at = 0;           // iteration whose order rebuilt the buckets (0: none)
};

struct ddp_join_state {
  bool active = false;
  join_options opts;
  troupe::work notify;  // this forward's "still training" allreduce
  troupe::tensor notify_count;
  troupe::work requires_sync_work;  // this forward's "the backward synchronises"
  troupe::tensor requires_sync;
  std::vector<troupe::tensor> zeros;  // per dtype: a zero gradient for the shadowed marks
};

struct ddp_engine::impl {
  impl(std::shared_ptr<torch::nn::Module> m, troupe::process_group& g, ddp_options o)
      : module(std::move(m)), pg(g), opts(std::move(o)) {}

  std::shared_ptr<torch::nn::Module> module;
  troupe::process_group& pg;
  ddp_options opts;
  std::vector<at::Tensor> params;  // reduced: those that require grad
  std::vector<std::string> names;
  std::unique_ptr<troupe::reducer> red;
  troupe::tensor_list copies;     // copy mode: where the averages land
  std::vector<at::Tensor> views;  // .grad of each parameter (bucket views or copies)
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<std::uintptr_t> hook_keys;
  bool has_hook = false;

  bool no_sync = false;
  bool in_step = false;  // this backward's step has begun
  /// torch's require_forward_param_sync: the next forward broadcasts buffers.
  bool require_forward_param_sync = true;
  std::int64_t iterations = 0;          // synchronised forwards (torch's num_iterations_)
  std::vector<char> used_without_sync;  // marked during no_sync since the last synchronised step
  std::vector<char> reachable;          // from the last forward's outputs (find_unused_parameters)
  bool know_reachable = false;
  std::vector<int> marks;         // hook firings per parameter in this step
  std::vector<int> static_marks;  // static_graph: the first step's (what a joined rank repeats)
  ddp_log_state log;
  ddp_join_state join;

  bool view_mode() const { return opts.gradient_as_bucket_view; }
  bool static_first() const { return opts.static_graph && red->steps() == 0; }
  at::Tensor grad_tensor(std::size_t i) const;

  // -- steps (distributed_data_parallel.cpp) -----------------------------------------
  /// Parameter i's accumulator ran: its gradient is final for this backward.
  void on_ready(std::size_t i);
  /// The backward reached DDP's sink node.
  void on_sink_backward();
  void mark(std::size_t i);
  void begin_step();
  /// The queued end of a step: wait for the buckets, .grad gets the averages.
  void end_step();
  /// The reducer's finish_step and the gradients' bookkeeping after it;
  /// `scale` multiplies the averages (join's divisor), 1: none.
  void finish(double scale);
  void find_reachable(const std::vector<at::Tensor>& outputs);
  /// Broadcasts the buffers from `src` when torch's forward would.
  void sync_buffers(int src);
  bool will_sync_buffers() const;

  // -- logging (ddp_logging.cpp) -------------------------------------------------------
  void log_construction();
  /// torch's should_collect_runtime_stats() for the current iteration count.
  bool should_collect() const;
  void record(ddp_event e);
  /// At the start of a synchronised forward: the previous iteration's stats.
  void sample();
  void log_error(const std::string& what);
  std::vector<std::int64_t> bucket_bytes() const;

  // -- join (ddp_join.cpp) ---------------------------------------------------------------
  /// A training rank's collectives before its forward inside join().
  void join_before_forward();
  /// Whether this rank still trains inside join(); used for the buffers' source.
  int buffer_source();
  /// A joined rank's answer to one forward (and backward) of the others.
  void shadow_iteration();
  /// A joined rank's step: every parameter contributes zeros.
  void shadow_step();
  /// The divisor's correction of this step's averages (1: none).
  double join_scale();
};

}  // namespace troupe_torch
