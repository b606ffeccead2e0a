// The reducer: buckets of gradients reduced as they become ready.
//
// Terms: a parameter is *ready* once its gradient sits in its bucket slot
// (copied there, or zeroed when unused); a bucket is *ready* once all its
// parameters are; a bucket is *launched* once its reduction started; *done*
// once that work completed. A step runs:
//   1. mark_ready / mark_unused fill slots; each completed bucket may launch.
//   2. The launcher (whichever thread finds the next bucket launchable; one at
//      a time) launches buckets strictly in index order: bucket b needs b
//      ready, and under a serial hook also b-1 done (its completion launches
//      the next). With find_unused_parameters the used-bitmap allreduce
//      follows the last bucket.
//   3. finish_step waits for every bucket in order, copies results that came
//      back in another tensor into the bucket, and writes the averages back
//      to the gradients of parameters some rank used.
// static_graph's first step delays everything to finish_step (step 3 after
// filling every slot there), and records which parameters are used.

#include "troupe/reducer.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <set>
#include <utility>

#include "training/tensor_ops.hpp"
#include "troupe/bucket_assignment.hpp"
#include "troupe/error.hpp"
#include "troupe/param_sync.hpp"

namespace troupe {

namespace {

[[noreturn]] void refuse(const std::string& op, const std::string& what) {
  throw error(errc::invalid_argument, "reducer" + op + ": " + what);
}

}  // namespace

struct reducer::impl : std::enable_shared_from_this<impl> {
  struct bucket {
    tensor buffer;
    std::vector<std::size_t> params;
    std::vector<std::int64_t> offsets;
    std::vector<shape_t> shapes;
    tensor_list views;
    // per step
    std::size_t pending = 0;
    bool ready = false;
    bool launched = false;
    bool done = false;
    work w;
  };
  struct slot {
    std::size_t bucket;
    std::size_t pos;
  };

  impl(process_group& g, reducer_options o) : pg(g), opts(std::move(o)) {}

  process_group& pg;
  reducer_options opts;
  tensor_list grads;  // what gradient(i) returns
  std::vector<bucket> buckets;
  std::vector<std::vector<std::size_t>> indices;
  std::vector<std::size_t> limits;
  std::vector<slot> where;
  comm_hook hook;
  bool has_hook = false;

  mutable std::mutex mtx;
  std::condition_variable cv;
  std::uint64_t steps = 0;
  std::uint64_t generation = 0;  // tells a late callback of an earlier step apart
  // per step
  bool in_step = false;
  std::vector<int> marks_left;     // marks still expected before the parameter is ready
  std::vector<bool> ready;         // slot filled (or being filled)
  std::vector<std::uint8_t> used;  // marked with a gradient in this step
  std::vector<int> first_counts;   // static_graph's first step: marks per parameter
  std::vector<tensor> latest;      // static_graph's first step: where to read at finish
  std::size_t next_launch = 0;
  bool launching = false;
  bool failed = false;  // a bucket failed: launch no more
  bool used_launched = false;
  work used_work;
  // static_graph, from the first step on
  std::vector<int> static_counts;
  std::vector<std::uint8_t> static_global_unused;

  // -- helpers ----------------------------------------------------------------

  std::size_t size() const { return grads.size(); }
  bool serial() const { return has_hook && hook.ordering == hook_ordering::serial; }
  bool static_first() const { return opts.static_graph && steps == 0; }
  bool static_later() const { return opts.static_graph && steps > 0; }
  bool dynamic_find_unused() const { return opts.find_unused_parameters && !opts.static_graph; }

  std::string label(std::size_t i) const {
    auto r = std::to_string(i);
    if (!opts.parameter_names.empty()) r += " (" + opts.parameter_names[i] + ")";
    return r;
  }
  std::string with_name(std::size_t i) const {
    return opts.parameter_names.empty() ? "" : " with name " + opts.parameter_names[i];
  }
  std::string list(const std::vector<std::size_t>& ps) const {
    std::string r;
    for (auto i : ps) r += (r.empty() ? "" : ", ") + label(i);
    return r;
  }

  void check_index(const char* op, std::size_t i) const {
    if (i >= size())
      refuse(op, "parameter index " + std::to_string(i) + " out of range for " +
                     std::to_string(size()) + " parameters");
  }

  tensor& view(std::size_t i) { return buckets[where[i].bucket].views[where[i].pos]; }

  /// Starts a step if none is open; returns the parameters static_graph marks
  /// unused by itself (to be zeroed and completed outside the lock).
  std::vector<std::size_t> begin_step_locked() {
    if (in_step) return {};
    in_step = true;
    ++generation;
    marks_left.assign(size(), 1);
    if (static_later())
      for (std::size_t i = 0; i < size(); ++i) marks_left[i] = static_counts[i];
    ready.assign(size(), false);
    used.assign(size(), 0);
    first_counts.assign(size(), 0);
    latest.assign(size(), tensor{});
    for (auto& b : buckets) {
      b.pending = b.params.size();
      b.ready = b.launched = b.done = false;
      b.w = work{};
    }
    next_launch = 0;
    launching = failed = used_launched = false;
    used_work = work{};
    std::vector<std::size_t> auto_unused;
    if (static_later())
      for (std::size_t i = 0; i < size(); ++i)
        if (static_counts[i] == 0) {
          ready[i] = true;
          auto_unused.push_back(i);
        }
    return auto_unused;
  }

  /// Zeroes the slots of `ps` (outside the lock).
  void zero_slots(const std::vector<std::size_t>& ps) {
    for (auto i : ps) view(i).zero_();
  }

  /// The slots of `ps` are filled: complete their buckets and launch what can go.
  void complete(const std::vector<std::size_t>& ps) {
    if (ps.empty()) return;
    {
      std::lock_guard<std::mutex> g{mtx};
      for (auto i : ps) {
        auto& b = buckets[where[i].bucket];
        if (--b.pending == 0) b.ready = true;
      }
    }
    try_launch();
  }

  /// Launches the next buckets while they may go (one launcher at a time).
  void try_launch() {
    std::unique_lock<std::mutex> lk{mtx};
    if (launching) return;
    launching = true;
    const auto gen = generation;
    while (next_launch < buckets.size()) {
      const auto b = next_launch;
      auto& bk = buckets[b];
      if (!bk.ready || (serial() && b > 0 && !buckets[b - 1].done && !failed)) break;
      ++next_launch;
      lk.unlock();
      auto w = failed ? not_launched(b) : launch(b);
      lk.lock();
      bk.w = w;
      bk.launched = true;
      cv.notify_all();
      lk.unlock();
      w.on_complete([self = shared_from_this(), b, gen](const work& done) {
        self->on_bucket_done(b, gen, done.is_success());
      });
      lk.lock();
    }
    // The used-bitmap goes right after the last bucket (concurrent hooks only:
    // a serial hook may still issue collectives; finish_step sends it then).
    if (next_launch == buckets.size() && dynamic_find_unused() && !serial() && !used_launched) {
      used_launched = true;
      auto map = tensor::from_vector(std::vector<std::int32_t>(used.begin(), used.end()));
      lk.unlock();
      auto w = pg.allreduce(map, reduce_op::SUM);
      lk.lock();
      used_work = w;
      cv.notify_all();
    }
    launching = false;
  }

  void on_bucket_done(std::size_t b, std::uint64_t gen, bool ok) {
    {
      std::lock_guard<std::mutex> g{mtx};
      if (gen != generation) return;
      buckets[b].done = true;
      if (!ok) failed = true;
      cv.notify_all();
    }
    if (serial()) try_launch();
  }

  work not_launched(std::size_t b) {
    return work::failed("reducer.bucket", pg.name(),
                        std::make_exception_ptr(error(
                            errc::aborted, "bucket " + std::to_string(b) +
                                               " was not reduced: an earlier bucket failed")));
  }

  /// Starts bucket b's reduction: the hook, or an averaging allreduce.
  work launch(std::size_t b) {
    auto& bk = buckets[b];
    try {
      if (!has_hook) return pg.allreduce(bk.buffer, reduce_op::AVG);
      grad_bucket gb{b, buckets.size(), bk.buffer, bk.params, bk.offsets, bk.shapes};
      auto w = hook.run(gb);
      if (!w.valid())
        throw error(errc::invalid_argument, "the comm hook '" + hook.name +
                                                "' returned a work that is not attached to "
                                                "any operation");
      return w;
    } catch (...) {
      return work::failed("reducer.bucket", pg.name(), std::current_exception());
    }
  }

  /// Copies `grad` into parameter i's slot unless it is the slot.
  void fill_slot(std::size_t i, const tensor& grad) {
    auto& v = view(i);
    if (!grad.is_same(v)) v.copy_from(grad);
  }

  // -- the end of a step --------------------------------------------------------

  /// static_graph's first step: fill every slot now and launch every bucket.
  void delayed_reduction() {
    std::vector<std::size_t> unused;
    {
      std::lock_guard<std::mutex> g{mtx};
      for (std::size_t i = 0; i < size(); ++i) {
        used[i] = first_counts[i] > 0;
        if (!used[i]) unused.push_back(i);
      }
    }
    for (std::size_t i = 0; i < size(); ++i)
      if (used[i]) fill_slot(i, latest[i].defined() ? latest[i] : grads[i]);
    zero_slots(unused);
    {
      std::lock_guard<std::mutex> g{mtx};
      std::fill(ready.begin(), ready.end(), true);
      for (auto& b : buckets) {
        b.pending = 0;
        b.ready = true;
      }
    }
    try_launch();
  }

  /// Waits for every bucket; returns the first failure (empty: none).
  std::exception_ptr wait_buckets(std::size_t& failed_bucket) {
    std::exception_ptr first;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      work w;
      {
        std::unique_lock<std::mutex> lk{mtx};
        cv.wait(lk, [&] { return buckets[b].launched; });
        w = buckets[b].w;
      }
      try {
        w.wait();
      } catch (...) {
        if (!first) {
          first = std::current_exception();
          failed_bucket = b;
        }
      }
    }
    return first;
  }

  /// Which parameters no rank used: from the allreduced bitmap.
  std::vector<std::uint8_t> global_unused() {
    if (static_later()) return static_global_unused;
    if (!dynamic_find_unused() && !static_first()) return std::vector<std::uint8_t>(size(), 0);
    work w;
    {
      std::unique_lock<std::mutex> lk{mtx};
      if (!used_launched) {
        used_launched = true;
        auto map = tensor::from_vector(std::vector<std::int32_t>(used.begin(), used.end()));
        lk.unlock();
        used_work = pg.allreduce(map, reduce_op::SUM);
        lk.lock();
      }
      w = used_work;
    }
    auto sums = w.result()[0].to_vector<std::int32_t>();
    std::vector<std::uint8_t> r(size());
    for (std::size_t i = 0; i < size(); ++i) r[i] = sums[i] == 0;
    return r;
  }

  /// Puts a hook's result into its bucket when it came back elsewhere.
  void take_result(std::size_t b) {
    if (!has_hook) return;
    auto& bk = buckets[b];
    auto out = bk.w.result();
    if (out.empty() || !out[0].defined() || out[0].numel() != bk.buffer.numel() ||
        out[0].scalar_type() != bk.buffer.scalar_type())
      throw error(
          errc::invalid_argument,
          "reducer.finish_step: the comm hook '" + hook.name + "' of bucket " + std::to_string(b) +
              " returned " +
              (out.empty() || !out[0].defined() ? std::string("no tensor") : out[0].describe()) +
              "; expected the reduced buffer, " + bk.buffer.describe());
    if (!out[0].is_same(bk.buffer))
      bk.buffer.copy_from(out[0].is_contiguous() ? out[0] : out[0].clone());
  }

  [[noreturn]] void rethrow_bucket_failure(std::exception_ptr e, std::size_t b) {
    const auto prefix = "reducer.finish_step: bucket " + std::to_string(b) + " (parameters " +
                        list(buckets[b].params) + ") failed: ";
    try {
      std::rethrow_exception(e);
    } catch (const error& x) {
      throw error(x.code(), prefix + x.what());
    } catch (const std::exception& x) {
      throw error(errc::internal, prefix + x.what());
    }
  }
};

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
    tensor_list reversed(gradients.rbegin(), gradients.rend());
    std::vector<std::int64_t> order;
    for (auto i = gradients.size(); i-- > 0;) order.push_back(static_cast<std::int64_t>(i));
    auto a = compute_bucket_assignment_by_size(
        reversed, {std::min(o.first_bucket_bytes, o.bucket_cap_bytes), o.bucket_cap_bytes}, {},
        order);
    s.indices = std::move(a.buckets);
    s.limits = std::move(a.size_limits);
  }

  // The buckets' memory and each gradient's slot in it.
  s.where.resize(gradients.size());
  for (std::size_t b = 0; b < s.indices.size(); ++b) {
    impl::bucket bk;
    std::int64_t total = 0;
    for (auto i : s.indices[b]) {
      s.where[i] = {b, bk.params.size()};
      bk.params.push_back(i);
      bk.offsets.push_back(total);
      bk.shapes.push_back(gradients[i].shape());
      total += gradients[i].numel();
    }
    const auto& first = gradients[bk.params[0]];
    bk.buffer = tensor::zeros({total}, first.scalar_type(), first.get_device());
    for (std::size_t k = 0; k < bk.params.size(); ++k)
      bk.views.push_back(
          bk.buffer.flat_slice(bk.offsets[k], gradients[bk.params[k]].numel()).view(bk.shapes[k]));
    s.buckets.push_back(std::move(bk));
  }
  if (o.gradient_as_bucket_view)
    for (std::size_t i = 0; i < gradients.size(); ++i) {
      s.view(i).copy_from(gradients[i]);
      s.grads[i] = s.view(i);
    }
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
      ++s.first_counts[i];
      s.latest[i] = grad;
      return;
    }
    if (--s.marks_left[i] > 0) return;  // static_graph: more marks to come
    s.ready[i] = true;
    s.used[i] = 1;
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
