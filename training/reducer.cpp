// The reducer's public calls: construction (the assignment and the buckets'
// memory), hooks, marks and the end of a step. The machinery they drive is in
// reducer_state.

#include "troupe/reducer.hpp"

#include <algorithm>
#include <mutex>
#include <set>
#include <utility>

#include "training/reducer_state.hpp"
#include "troupe/bucket_assignment.hpp"
#include "troupe/error.hpp"
#include "troupe/param_sync.hpp"

namespace troupe {

namespace {

[[noreturn]] void refuse(const std::string& op, const std::string& what) {
  detail::reducer_refuse(op, what);
}

}  // namespace

// -- construction -------------------------------------------------------------------

reducer::reducer(process_group& pg, tensor_list gradients, reducer_options options)
    : impl_(std::make_shared<impl>(pg, std::move(options))) {
  auto& s = *impl_;
  const auto& o = s.opts;
  if (gradients.empty()) refuse("", "no gradients");
  if (!o.parameter_names.empty() && o.parameter_names.size() != gradients.size())
    refuse("", std::to_string(o.parameter_names.size()) + " parameter names for " +
                   std::to_string(gradients.size()) + " gradients");
  if (o.bucket_cap_bytes == 0 || o.first_bucket_bytes == 0)
    refuse("", "bucket_cap_bytes and first_bucket_bytes must be positive");
  std::set<const void*> seen;
  for (std::size_t i = 0; i < gradients.size(); ++i) {
    const auto& g = gradients[i];
    if (!g.defined()) refuse("", "gradient " + s.label(i) + " is undefined");
    if (!g.is_contiguous())
      refuse("", "gradient " + s.label(i) + " is not contiguous: " + g.describe());
    if (!is_floating_point(g.scalar_type()) && !is_complex(g.scalar_type()))
      refuse("", "gradient " + s.label(i) + " is " + g.describe() +
                     "; gradients are floating or complex");
    if (g.numel() > 0 && !seen.insert(g.data()).second)
      refuse("", "gradient " + s.label(i) + " shares its memory with another gradient");
  }
  s.grads = gradients;
  s.static_counts.assign(gradients.size(), 0);
  s.static_global_unused.assign(gradients.size(), 0);

  // Every rank must have the same parameters, or the buckets would not match.
  verify_param_shapes_across_processes(pg, gradients, o.parameter_names);

  // The assignment: reverse parameter order, a small first bucket.
  if (!o.bucket_indices.empty()) {
    std::vector<int> count(gradients.size(), 0);
    for (std::size_t b = 0; b < o.bucket_indices.size(); ++b) {
      if (o.bucket_indices[b].empty()) refuse("", "bucket " + std::to_string(b) + " is empty");
      std::size_t bytes = 0;
      for (auto i : o.bucket_indices[b]) {
        s.check_index("", i);
        if (++count[i] > 1) refuse("", "parameter " + s.label(i) + " is in two buckets");
        const auto& first = gradients[o.bucket_indices[b][0]];
        if (gradients[i].scalar_type() != first.scalar_type() ||
            !(gradients[i].get_device() == first.get_device()))
          refuse("", "bucket " + std::to_string(b) + " mixes " + first.describe() + " and " +
                         gradients[i].describe());
        bytes += gradients[i].nbytes();
      }
      s.indices.push_back(o.bucket_indices[b]);
      s.limits.push_back(bytes);
    }
    for (std::size_t i = 0; i < gradients.size(); ++i)
      if (count[i] == 0) refuse("", "parameter " + s.label(i) + " is in no bucket");
  } else {
    std::vector<std::int64_t> reverse;
    for (auto i = gradients.size(); i-- > 0;) reverse.push_back(static_cast<std::int64_t>(i));
    auto a = s.assignment_for(reverse);
    s.indices = std::move(a.buckets);
    s.limits = std::move(a.size_limits);
  }

  // The buckets' memory and each gradient's slot in it.
  s.allocate_buckets();
}

reducer::~reducer() = default;

void reducer::register_comm_hook(comm_hook hook) {
  auto& s = *impl_;
  std::lock_guard<std::mutex> g{s.mtx};
  if (!hook.run) refuse(".register_comm_hook", "the hook has no function");
  if (s.has_hook)
    refuse(".register_comm_hook",
           "register_comm_hook can only be called once (hook '" + s.hook.name + "' is registered)");
  if (s.in_step) refuse(".register_comm_hook", "a step is in progress; register before it");
  s.hook = std::move(hook);
  s.has_hook = true;
}

const tensor& reducer::gradient(std::size_t i) const {
  impl_->check_index(".gradient", i);
  return impl_->grads[i];
}

tensor_list reducer::gradients() const {
  return impl_->grads;
}

std::size_t reducer::size() const noexcept {
  return impl_->size();
}

// -- a step ---------------------------------------------------------------------------

void reducer::mark_ready(std::size_t i) {
  impl_->check_index(".mark_ready", i);
  mark_ready(i, impl_->grads[i]);
}

void reducer::mark_ready(std::size_t i, const tensor& grad) {
  auto& s = *impl_;
  const char* op = ".mark_ready";
  s.check_index(op, i);
  if (!grad.defined() || grad.numel() != s.grads[i].numel() ||
      grad.scalar_type() != s.grads[i].scalar_type())
    refuse(op, "the gradient of parameter " + s.label(i) + " must be like " +
                   s.grads[i].describe() + ", got " +
                   (grad.defined() ? grad.describe() : std::string("an undefined tensor")));
  std::vector<std::size_t> auto_unused;
  {
    std::lock_guard<std::mutex> g{s.mtx};
    if (s.static_later()) {
      if (s.static_counts[i] == 0)
        refuse(op, "parameter " + s.label(i) +
                       ": Your training graph has changed in this iteration, e.g., one parameter "
                       "is unused in first iteration, but then got used in the second "
                       "iteration. this is not compatible with static_graph set to True.");
      if ((s.in_step ? s.marks_left[i] : s.static_counts[i]) == 0 || (s.in_step && s.ready[i]))
        refuse(op, "Expected to mark a variable ready only once. Parameter at index " +
                       std::to_string(i) + s.with_name(i) +
                       " has been marked as ready more often than in the first step (" +
                       std::to_string(s.static_counts[i]) + ") of this static graph.");
    } else if (!s.static_first() && s.in_step && s.ready[i]) {
      refuse(op, "Expected to mark a variable ready only once. Parameter at index " +
                     std::to_string(i) + s.with_name(i) +
                     " has been marked as ready twice. This means that multiple autograd engine "
                     "hooks have fired for this particular parameter during this iteration.");
    }
    auto_unused = s.begin_step_locked();
    if (s.static_first()) {
      if (s.first_counts[i]++ == 0) s.ready_order.push_back(static_cast<std::int64_t>(i));
      s.latest[i] = grad;
      return;
    }
    if (--s.marks_left[i] > 0) return;  // static_graph: more marks to come
    s.ready[i] = true;
    s.used[i] = 1;
    if (s.steps == 0) s.ready_order.push_back(static_cast<std::int64_t>(i));
  }
  s.zero_slots(auto_unused);
  s.complete(auto_unused);
  s.fill_slot(i, grad);
  s.complete({i});
}

void reducer::mark_unused(std::size_t i) {
  auto& s = *impl_;
  const char* op = ".mark_unused";
  s.check_index(op, i);
  if (!s.opts.find_unused_parameters && !s.opts.static_graph)
    refuse(op, "parameter " + s.label(i) +
                   ": marking a parameter unused needs find_unused_parameters or static_graph");
  std::vector<std::size_t> auto_unused;
  {
    std::lock_guard<std::mutex> g{s.mtx};
    if (s.static_later() && s.static_counts[i] != 0)
      refuse(op, "parameter " + s.label(i) +
                     ": Your training graph has changed in this iteration: it was used in the "
                     "first step; this is not compatible with static_graph set to True.");
    if (s.static_first() && s.in_step && s.first_counts[i] > 0)
      refuse(op, "parameter " + s.label(i) + " was marked ready in this step");
    if (s.dynamic_find_unused() && s.in_step && s.ready[i])
      refuse(op, "Expected to mark a variable ready only once. Parameter at index " +
                     std::to_string(i) + s.with_name(i) + " has already been marked in this step.");
    auto_unused = s.begin_step_locked();
    if (!s.dynamic_find_unused()) {
      // static_graph: the first step records it as unused; later steps did already.
    } else {
      s.ready[i] = true;
      s.used[i] = 0;
      auto_unused.push_back(i);
    }
  }
  s.zero_slots(auto_unused);
  s.complete(auto_unused);
}

step_report reducer::finish_step() {
  auto& s = *impl_;
  std::vector<std::size_t> to_zero, missing;
  {
    std::lock_guard<std::mutex> g{s.mtx};
    to_zero = s.begin_step_locked();
    if (!s.static_first())
      for (std::size_t i = 0; i < s.size(); ++i)
        if (!s.ready[i]) missing.push_back(i);
    if (!missing.empty() && s.dynamic_find_unused()) {
      for (auto i : missing) {
        s.ready[i] = true;
        s.used[i] = 0;
        to_zero.push_back(i);
      }
      missing.clear();
    }
  }
  s.zero_slots(to_zero);
  s.complete(to_zero);
  if (!missing.empty()) {
    if (s.static_later())
      refuse(".finish_step",
             "parameters marked ready fewer times than in the first step of "
             "this static graph: " +
                 s.list(missing));
    refuse(".finish_step",
           "parameters never marked ready in this step: " + s.list(missing) +
               ". Every parameter must be marked ready in every step; for parameters that take "
               "no part in some steps, enable find_unused_parameters (or static_graph)");
  }
  if (s.static_first()) s.delayed_reduction();

  // Wait for every bucket, in order; then the used-bitmap.
  std::size_t failed_bucket = 0;
  auto failure = s.wait_buckets(failed_bucket);
  auto end_step = [&] {
    std::lock_guard<std::mutex> g{s.mtx};
    s.in_step = false;
    ++s.generation;
  };
  if (failure) {
    end_step();
    s.rethrow_bucket_failure(failure, failed_bucket);
  }
  std::vector<std::uint8_t> global_unused;
  try {
    global_unused = s.global_unused();
    for (std::size_t b = 0; b < s.buckets.size(); ++b) s.take_result(b);
  } catch (...) {
    end_step();
    throw;
  }

  // Write back: the averages, except where no rank used the parameter.
  step_report report;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (!s.used[i]) report.unused_parameters.push_back(i);
    if (global_unused[i]) {
      report.globally_unused_parameters.push_back(i);
      continue;
    }
    if (!s.opts.gradient_as_bucket_view) s.grads[i].copy_from(s.view(i));
  }
  // After the first step: buckets in the order the gradients came.
  const auto& o = s.opts;
  if (s.steps == 0 && o.rebuild_buckets && o.bucket_indices.empty() &&
      (o.static_graph || !o.find_unused_parameters)) {
    try {
      report.buckets_rebuilt = s.rebuild_buckets();
    } catch (...) {
      end_step();
      throw;
    }
  }
  std::lock_guard<std::mutex> g{s.mtx};
  if (s.static_first()) {
    s.static_counts = s.first_counts;
    s.static_global_unused = global_unused;
  }
  s.in_step = false;
  ++s.generation;
  ++s.steps;
  return report;
}

// -- introspection -------------------------------------------------------------------

std::size_t reducer::bucket_count() const noexcept {
  return impl_->buckets.size();
}

const std::vector<std::vector<std::size_t>>& reducer::bucket_indices() const noexcept {
  return impl_->indices;
}

const std::vector<std::size_t>& reducer::bucket_size_limits() const noexcept {
  return impl_->limits;
}

tensor reducer::bucket_buffer(std::size_t b) const {
  if (b >= impl_->buckets.size())
    refuse(".bucket_buffer", "bucket " + std::to_string(b) + " out of range for " +
                                 std::to_string(impl_->buckets.size()) + " buckets");
  return impl_->buckets[b].buffer;
}

work reducer::bucket_work(std::size_t b) const {
  if (b >= impl_->buckets.size())
    refuse(".bucket_work", "bucket " + std::to_string(b) + " out of range for " +
                               std::to_string(impl_->buckets.size()) + " buckets");
  std::lock_guard<std::mutex> g{impl_->mtx};
  return impl_->buckets[b].w;
}

std::uint64_t reducer::steps() const {
  std::lock_guard<std::mutex> g{impl_->mtx};
  return impl_->steps;
}

}  // namespace troupe
