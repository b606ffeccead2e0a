// PowerSGD hooks. One step of a bucket (layer-wise form):
//   1. compress:   M += error (error feedback); Q orthogonalised (random the
//                  first time, else warm from the last step); P = M Q.
//   2. allreduce:  [P | uncompressed gradients], summed.
//   3. project:    uncompressed parts averaged into the bucket; P
//                  orthogonalised; Q = Mᵀ P.
//   4. allreduce:  Q, summed, then divided by the ranks.
//   5. decompress: M = P Qᵀ into the bucket; error = what was sent - M.
// The batched form does the same on the whole bucket as one square matrix.
// Steps 3 and 5 run in continuations; step 4's allreduce is issued from
// there, hence hook_ordering::serial.

#include "troupe/powersgd.hpp"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <random>
#include <utility>
#include <vector>

#include "training/tensor_ops.hpp"
#include "training/work_chain.hpp"
#include "troupe/error.hpp"

namespace troupe {

struct powersgd_state::impl {
  powersgd_options o;
  mutable std::mutex mtx;
  std::mt19937_64 rng;
  std::uint64_t iter = 0;
  std::uint64_t before = 0;
  std::uint64_t after = 0;
  std::map<std::size_t, tensor> error;     // per bucket: the last compression error
  std::map<std::size_t, tensor> q_memory;  // per bucket: the last Q (warm start)
  std::map<std::size_t, tensor> scratch;   // per bucket: the gradient as sent (error feedback)

  /// A buffer of `numel` elements of `t` kept for bucket idx in `m` (no page
  /// faults of a fresh allocation every step).
  static tensor kept(std::map<std::size_t, tensor>& m, std::size_t idx, std::int64_t numel,
                     dtype t) {
    auto& x = m[idx];
    if (!x.defined() || x.numel() != numel || x.scalar_type() != t) x = tensor::empty({numel}, t);
    return x;
  }

  /// c10d's maybe_increase_iter: a step ends with its last bucket.
  void advance(bool last_bucket) {
    if (last_bucket) ++iter;
  }
  /// c10d's rng.randint(1_000_000_000): a fresh seed per initialisation.
  std::uint64_t next_seed() { return rng() % 1000000000u; }
};

powersgd_state::powersgd_state(const powersgd_options& options) : impl_(std::make_unique<impl>()) {
  const auto& o = options;
  if ((o.use_error_feedback || o.warm_start) && o.start_powersgd_iter <= 1)
    throw error(errc::invalid_argument,
                "powersgd_state: Expect `start_powerSGD_iter` > 1 if `use_error_feedback` or "
                "`warm_start` is enabled, because PowerSGD can only be applied after the first "
                "two iterations in DDP.");
  if (o.matrix_approximation_rank < 1)
    throw error(errc::invalid_argument, "powersgd_state: matrix_approximation_rank " +
                                            std::to_string(o.matrix_approximation_rank) +
                                            " must be at least 1");
  if (!(o.min_compression_rate > 0) || !(o.orthogonalization_epsilon >= 0))
    throw error(errc::invalid_argument,
                "powersgd_state: min_compression_rate must be positive and "
                "orthogonalization_epsilon non-negative, got " +
                    std::to_string(o.min_compression_rate) + " and " +
                    std::to_string(o.orthogonalization_epsilon));
  impl_->o = o;
  impl_->rng.seed(o.random_seed);
}

powersgd_state::~powersgd_state() = default;

const powersgd_options& powersgd_state::options() const noexcept {
  return impl_->o;
}

std::uint64_t powersgd_state::iteration() const {
  std::lock_guard<std::mutex> g{impl_->mtx};
  return impl_->iter;
}

powersgd_stats powersgd_state::compression_stats() const {
  std::lock_guard<std::mutex> g{impl_->mtx};
  const auto& s = *impl_;
  return {s.after > 0 ? static_cast<double>(s.before) / static_cast<double>(s.after) : 0.0,
          s.before, s.after};
}

namespace {

template <class T>
using row_matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using matrix_map = Eigen::Map<row_matrix<T>>;

/// Orthonormal columns in place: Gram-Schmidt up to rank 2 (as c10d, with
/// its epsilon), Householder QR above.
template <class T>
void orthogonalize(T* data, Eigen::Index rows, Eigen::Index cols, double epsilon) {
  matrix_map<T> a(data, rows, cols);
  if (cols <= 2) {
    for (Eigen::Index i = 0; i < cols; ++i) {
      const T norm = a.col(i).norm();
      if (epsilon == 0)
        a.col(i) = norm == T(0) ? row_matrix<T>::Zero(rows, 1) : row_matrix<T>(a.col(i) / norm);
      else
        a.col(i) /= norm + static_cast<T>(epsilon);
      for (Eigen::Index j = i + 1; j < cols; ++j) a.col(j) -= a.col(i).dot(a.col(j)) * a.col(i);
    }
    return;
  }
  Eigen::HouseholderQR<row_matrix<T>> qr(a);
  a = qr.householderQ() * row_matrix<T>::Identity(rows, cols);
}

template <class T>
void fill_normal(T* data, std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<T> d;
  for (std::int64_t i = 0; i < n; ++i) data[i] = d(gen);
}

void check_bucket(const char* op, const tensor& buffer) {
  if (!buffer.is_cpu() ||
      (buffer.scalar_type() != dtype::float32 && buffer.scalar_type() != dtype::float64))
    throw error(errc::invalid_argument,
                std::string(op) + ": PowerSGD compresses host float32 and float64 buckets, got " +
                    buffer.describe());
}

/// The vanilla allreduce of the first start_powersgd_iter steps.
work average(process_group& pg, tensor buffer) {
  return pg.allreduce(buffer, reduce_op::AVG).then([buffer](const work& w) {
    w.result();
    return tensor_list{buffer};
  });
}

/// One gradient compressed on its own: rows n, columns m, rank r; where it
/// is in the bucket, and where its factors are in P and Q.
struct matrix_job {
  std::int64_t offset, n, m, r, p_off, q_off;
};

template <class T>
work layerwise(process_group& pg, const std::shared_ptr<powersgd_state>& state,
               const grad_bucket& b) {
  auto& st = state->internals();
  std::unique_lock<std::mutex> lk{st.mtx};
  auto buffer = b.buffer();
  const bool last = b.is_last();
  if (st.iter < st.o.start_powersgd_iter) {
    st.advance(last);
    lk.unlock();
    return average(pg, buffer);
  }
  const auto idx = b.index();
  const auto& o = st.o;
  const auto dt = buffer.scalar_type();

  // 1. Error feedback: add the last error, keep what is sent.
  tensor sent;
  if (o.use_error_feedback) {
    if (auto it = st.error.find(idx); it != st.error.end() && it->second.numel() == buffer.numel())
      detail::add_inplace("powersgd_hook", buffer, it->second);
    else
      st.error[idx] = tensor::zeros({buffer.numel()}, dt);
    sent = powersgd_state::impl::kept(st.scratch, idx, buffer.numel(), dt);
    sent.copy_from(buffer);
  }

  // Which gradients are worth compressing.
  std::vector<matrix_job> jobs;
  std::vector<std::pair<std::int64_t, std::int64_t>> plain;  // offset, numel
  std::int64_t total_p = 0, total_q = 0, total_u = 0;
  for (std::size_t k = 0; k < b.shapes().size(); ++k) {
    const auto& shape = b.shapes()[k];
    std::int64_t numel = 1;
    for (auto d : shape) numel *= d;
    const std::int64_t n = shape.empty() ? 1 : shape[0];
    const std::int64_t m = n > 0 ? numel / n : 0;
    const std::int64_t r = std::min<std::int64_t>({n, m, o.matrix_approximation_rank});
    const bool worth =
        static_cast<double>((n + m) * r) * o.min_compression_rate < static_cast<double>(n * m);
    st.before += static_cast<std::uint64_t>(n * m);
    if (worth) {
      jobs.push_back({b.offsets()[k], n, m, r, total_p, total_q});
      total_p += n * r;
      total_q += m * r;
      st.after += static_cast<std::uint64_t>((n + m) * r);
    } else {
      plain.emplace_back(b.offsets()[k], numel);
      total_u += numel;
      st.after += static_cast<std::uint64_t>(numel);
    }
  }

  // Q: warm from the last step, or random (the same on every rank).
  // (A bucket of another size, after the reducer rebuilt its buckets, starts afresh.)
  const bool fresh =
      !o.warm_start || !st.q_memory.count(idx) || st.q_memory[idx].numel() != total_q;
  if (fresh) st.q_memory[idx] = tensor::empty({total_q}, dt);
  auto q = st.q_memory[idx];
  if (fresh) fill_normal(q.data_as<T>(), total_q, st.next_seed());
  for (auto& j : jobs)
    orthogonalize(q.data_as<T>() + j.q_off, j.m, j.r, o.orthogonalization_epsilon);

  // P = M Q, and the uncompressed gradients behind it: one allreduce.
  auto pu = tensor::empty({total_p + total_u}, dt);
  T* base = buffer.data_as<T>();
  for (auto& j : jobs)
    matrix_map<T>(pu.data_as<T>() + j.p_off, j.n, j.r).noalias() =
        matrix_map<T>(base + j.offset, j.n, j.m) *
        matrix_map<T>(q.data_as<T>() + j.q_off, j.m, j.r);
  std::int64_t at = total_p;
  for (auto [off, numel] : plain) {
    std::copy(base + off, base + off + numel, pu.data_as<T>() + at);
    at += numel;
  }
  lk.unlock();

  const double world = pg.size();
  const double eps = o.orthogonalization_epsilon;
  auto w = pg.allreduce(pu, reduce_op::SUM);
  auto projected = detail::and_then(
      w, [&pg, state, buffer, q, pu, jobs, plain, total_p, world, eps](const work&) {
        // 3. Average the uncompressed parts into the bucket; Q = Mᵀ orth(P).
        T* base = buffer.data_as<T>();
        std::int64_t at = total_p;
        for (auto [off, numel] : plain) {
          const T* src = pu.data_as<T>() + at;
          for (std::int64_t i = 0; i < numel; ++i) base[off + i] = src[i] / static_cast<T>(world);
          at += numel;
        }
        for (auto& j : jobs) {
          T* p = pu.data_as<T>() + j.p_off;
          orthogonalize(p, j.n, j.r, eps);
          matrix_map<T>(q.data_as<T>() + j.q_off, j.m, j.r).noalias() =
              matrix_map<T>(base + j.offset, j.n, j.m).transpose() * matrix_map<T>(p, j.n, j.r);
        }
        return pg.allreduce(q, reduce_op::SUM);
      });
  return projected.then([state, buffer, q, pu, jobs, sent, idx, last, world](const work& done) {
    done.result();
    // 5. M = P Qᵀ / ranks; remember the error.
    auto& st = state->internals();
    std::lock_guard<std::mutex> g{st.mtx};
    detail::scale_inplace("powersgd_hook", q, 1.0 / world);  // kept for the warm start
    T* base = buffer.data_as<T>();
    for (auto& j : jobs)
      matrix_map<T>(base + j.offset, j.n, j.m).noalias() =
          matrix_map<T>(pu.data_as<T>() + j.p_off, j.n, j.r) *
          matrix_map<T>(q.data_as<T>() + j.q_off, j.m, j.r).transpose();
    if (st.o.use_error_feedback)
      detail::subtract_into("powersgd_hook", st.error[idx], sent, buffer);
    if (!st.o.warm_start) st.q_memory.erase(idx);
    st.advance(last);
    return tensor_list{buffer};
  });
}

template <class T>
work batched(process_group& pg, const std::shared_ptr<powersgd_state>& state,
             const grad_bucket& b) {
  auto& st = state->internals();
  std::unique_lock<std::mutex> lk{st.mtx};
  auto buffer = b.buffer();
  const bool last = b.is_last();
  if (st.iter < st.o.start_powersgd_iter) {
    st.advance(last);
    lk.unlock();
    return average(pg, buffer);
  }
  const auto idx = b.index();
  const auto& o = st.o;
  const auto dt = buffer.scalar_type();
  const std::int64_t total = buffer.numel();
  const auto side = static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(total))));
  const std::int64_t r = std::min<std::int64_t>(side, o.matrix_approximation_rank);
  st.before += static_cast<std::uint64_t>(total);
  st.after += static_cast<std::uint64_t>(side * r * 2);

  // The bucket as a square matrix, zero-padded, with the last error added.
  auto square = tensor::zeros({side * side}, dt);
  std::copy(buffer.data_as<T>(), buffer.data_as<T>() + total, square.data_as<T>());
  tensor sent;
  if (o.use_error_feedback) {
    if (auto it = st.error.find(idx); it != st.error.end() && it->second.numel() == side * side)
      detail::add_inplace("batched_powersgd_hook", square, it->second);
    else
      st.error[idx] = tensor::zeros({side * side}, dt);
    sent = powersgd_state::impl::kept(st.scratch, idx, side * side, dt);
    sent.copy_from(square);
  }
  const bool fresh =
      !o.warm_start || !st.q_memory.count(idx) || st.q_memory[idx].numel() != side * r;
  if (fresh) {
    st.q_memory[idx] = tensor::empty({side * r}, dt);
    fill_normal(st.q_memory[idx].data_as<T>(), side * r, st.next_seed());
  }
  auto q = st.q_memory[idx];
  orthogonalize(q.data_as<T>(), side, r, o.orthogonalization_epsilon);
  auto p = tensor::empty({side * r}, dt);
  matrix_map<T>(p.data_as<T>(), side, r).noalias() =
      matrix_map<T>(square.data_as<T>(), side, side) * matrix_map<T>(q.data_as<T>(), side, r);
  lk.unlock();

  const double world = pg.size();
  const double eps = o.orthogonalization_epsilon;
  auto projected = detail::and_then(
      pg.allreduce(p, reduce_op::SUM), [&pg, p, q, square, side, r, eps](const work&) {
        orthogonalize(p.data_as<T>(), side, r, eps);
        matrix_map<T>(q.data_as<T>(), side, r).noalias() =
            matrix_map<T>(square.data_as<T>(), side, side).transpose() *
            matrix_map<T>(p.data_as<T>(), side, r);
        return pg.allreduce(q, reduce_op::SUM);
      });
  return projected.then([state, buffer, p, q, square, sent, idx, last, side, r, total,
                         world](const work& done) {
    done.result();
    auto& st = state->internals();
    std::lock_guard<std::mutex> g{st.mtx};
    detail::scale_inplace("batched_powersgd_hook", q, 1.0 / world);
    matrix_map<T>(square.data_as<T>(), side, side).noalias() =
        matrix_map<T>(p.data_as<T>(), side, r) * matrix_map<T>(q.data_as<T>(), side, r).transpose();
    if (st.o.use_error_feedback)
      detail::subtract_into("batched_powersgd_hook", st.error[idx], sent, square);
    std::copy(square.data_as<T>(), square.data_as<T>() + total, buffer.data_as<T>());
    if (!st.o.warm_start) st.q_memory.erase(idx);
    st.advance(last);
    return tensor_list{buffer};
  });
}

comm_hook make_hook(process_group& pg, std::shared_ptr<powersgd_state> state, bool batch) {
  if (!state) throw error(errc::invalid_argument, "powersgd_hook: no state");
  const char* name = batch ? "batched_powersgd" : "powersgd";
  return {[&pg, state, batch, name](const grad_bucket& b) {
            check_bucket(name, b.buffer());
            if (b.buffer().scalar_type() == dtype::float64)
              return batch ? batched<double>(pg, state, b) : layerwise<double>(pg, state, b);
            return batch ? batched<float>(pg, state, b) : layerwise<float>(pg, state, b);
          },
          hook_ordering::serial, name};
}

}  // namespace

comm_hook powersgd_hook(process_group& pg, std::shared_ptr<powersgd_state> state) {
  return make_hook(pg, std::move(state), false);
}

comm_hook batched_powersgd_hook(process_group& pg, std::shared_ptr<powersgd_state> state) {
  return make_hook(pg, std::move(state), true);
}

}  // namespace troupe
