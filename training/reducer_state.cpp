#include "training/reducer_state.hpp"

#include <algorithm>
#include <utility>

#include "troupe/error.hpp"

namespace troupe {

namespace detail {
void reducer_refuse(const std::string& op, const std::string& what) {
  throw error(errc::invalid_argument, "reducer" + op + ": " + what);
}
}  // namespace detail

using detail::reducer_refuse;

std::string reducer::impl::label(std::size_t i) const {
  auto r = std::to_string(i);
  if (!opts.parameter_names.empty()) r += " (" + opts.parameter_names[i] + ")";
  return r;
}

std::string reducer::impl::with_name(std::size_t i) const {
  return opts.parameter_names.empty() ? "" : " with name " + opts.parameter_names[i];
}

std::string reducer::impl::list(const std::vector<std::size_t>& ps) const {
  std::string r;
  for (auto i : ps) r += (r.empty() ? "" : ", ") + label(i);
  return r;
}

void reducer::impl::check_index(const char* op, std::size_t i) const {
  if (i >= size())
    reducer_refuse(op, "parameter index " + std::to_string(i) + " out of range for " +
                           std::to_string(size()) + " parameters");
}

std::vector<std::size_t> reducer::impl::begin_step_locked() {
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
  ready_order.clear();
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

void reducer::impl::zero_slots(const std::vector<std::size_t>& ps) {
  for (auto i : ps) view(i).zero_();
}

void reducer::impl::complete(const std::vector<std::size_t>& ps) {
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

void reducer::impl::try_launch() {
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

void reducer::impl::on_bucket_done(std::size_t b, std::uint64_t gen, bool ok) {
  {
    std::lock_guard<std::mutex> g{mtx};
    if (gen != generation) return;
    buckets[b].done = true;
    if (!ok) failed = true;
    cv.notify_all();
  }
  if (serial()) try_launch();
}

work reducer::impl::not_launched(std::size_t b) {
  return work::failed("reducer.bucket", pg.name(),
                      std::make_exception_ptr(
                          error(errc::aborted, "bucket " + std::to_string(b) +
                                                   " was not reduced: an earlier bucket failed")));
}

work reducer::impl::launch(std::size_t b) {
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

void reducer::impl::fill_slot(std::size_t i, const tensor& grad) {
  auto& v = view(i);
  if (!grad.is_same(v)) v.copy_from(grad);
}

void reducer::impl::delayed_reduction() {
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

std::exception_ptr reducer::impl::wait_buckets(std::size_t& failed_bucket) {
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

std::vector<std::uint8_t> reducer::impl::global_unused() {
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

void reducer::impl::take_result(std::size_t b) {
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

void reducer::impl::rethrow_bucket_failure(std::exception_ptr e, std::size_t b) {
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

bucket_assignment reducer::impl::assignment_for(const std::vector<std::int64_t>& order) const {
  tensor_list in_order;
  for (auto i : order) in_order.push_back(grads[static_cast<std::size_t>(i)]);
  return compute_bucket_assignment_by_size(
      in_order, {std::min(opts.first_bucket_bytes, opts.bucket_cap_bytes), opts.bucket_cap_bytes},
      {}, order);
}

void reducer::impl::allocate_buckets() {
  std::vector<bucket> fresh;
  where.assign(size(), slot{0, 0});
  for (std::size_t b = 0; b < indices.size(); ++b) {
    bucket bk;
    std::int64_t total = 0;
    for (auto i : indices[b]) {
      where[i] = {b, bk.params.size()};
      bk.params.push_back(i);
      bk.offsets.push_back(total);
      bk.shapes.push_back(grads[i].shape());
      total += grads[i].numel();
    }
    const auto& first = grads[bk.params[0]];
    bk.buffer = tensor::zeros({total}, first.scalar_type(), first.get_device());
    for (std::size_t k = 0; k < bk.params.size(); ++k)
      bk.views.push_back(
          bk.buffer.flat_slice(bk.offsets[k], grads[bk.params[k]].numel()).view(bk.shapes[k]));
    fresh.push_back(std::move(bk));
  }
  buckets = std::move(fresh);
  if (opts.gradient_as_bucket_view)
    for (std::size_t i = 0; i < size(); ++i) {
      view(i).copy_from(grads[i]);
      grads[i] = view(i);
    }
}

bool reducer::impl::rebuild_buckets() {
  // This rank's order of marks, then what was never marked (last index first).
  std::vector<std::int64_t> order = ready_order;
  std::vector<bool> seen(size(), false);
  for (auto i : order) seen[static_cast<std::size_t>(i)] = true;
  for (auto i = size(); i-- > 0;)
    if (!seen[i]) order.push_back(static_cast<std::int64_t>(i));
  // Every rank takes rank 0's, so that all build the same buckets.
  auto t = tensor::from_vector(order);
  pg.broadcast(t, 0).wait();
  auto a = assignment_for(t.to_vector<std::int64_t>());
  if (a.buckets == indices) return false;
  indices = std::move(a.buckets);
  limits = std::move(a.size_limits);
  allocate_buckets();
  return true;
}

}  // namespace troupe
