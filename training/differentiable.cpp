// Each forward copies what the collective would overwrite, runs the
// collective on the copy (or into fresh outputs) and completes with the new
// tensors; each backward is the collective that is the forward's adjoint.

#include "troupe/differentiable.hpp"

#include <string>
#include <utility>

#include "training/tensor_ops.hpp"
#include "training/work_chain.hpp"
#include "troupe/error.hpp"

namespace troupe::differentiable {

namespace {

[[noreturn]] void refuse(const char* op, const std::string& what) {
  throw error(errc::invalid_argument, std::string("differentiable.") + op + ": " + what);
}

/// SUM and AVG are linear; the others have no gradient rule here.
void check_linear(const char* op, const reduce_op& r) {
  if (r.op() == reduce_op::SUM || r.op() == reduce_op::AVG) return;
  refuse(op, "reduce op " + r.to_string() +
                 " has no gradient rule (its adjoint is not a collective of the gradients); "
                 "use SUM or AVG");
}

void check_defined(const char* op, const tensor& t, const char* what) {
  if (!t.defined()) refuse(op, std::string(what) + " is undefined");
}

tensor empty_as(const shape_t& shape, const tensor& like) {
  return tensor::empty(shape, like.scalar_type(), like.get_device());
}

/// Completes with `outs` once `w` did; `after` runs first (zeroing, scaling).
work with_outputs(const work& w, tensor_list outs, std::function<void()> after = {}) {
  return w.then([outs = std::move(outs), after = std::move(after)](const work& done) {
    done.result();  // rethrows the collective's failure
    if (after) after();
    return outs;
  });
}

/// 1/size() for AVG, 1 for SUM.
double adjoint_scale(const process_group& pg, const reduce_op& r) {
  return r.op() == reduce_op::AVG ? 1.0 / pg.size() : 1.0;
}

void scale_all(const tensor_list& ts, double s) {
  if (s == 1.0) return;
  for (auto& t : ts) detail::scale_inplace("differentiable", t, s);
}

/// A list of size() tensors: the one each rank sends or receives.
void check_per_rank(const char* op, const process_group& pg, const tensor_list& ts,
                    const char* what) {
  if (static_cast<int>(ts.size()) != pg.size())
    refuse(op, std::string(what) + " has " + std::to_string(ts.size()) +
                   " tensors; expected one per rank (" + std::to_string(pg.size()) + ")");
  for (auto& t : ts) check_defined(op, t, what);
}

void check_same_shapes(const char* op, const tensor_list& ts, const char* what) {
  for (std::size_t i = 1; i < ts.size(); ++i)
    if (ts[i].shape() != ts[0].shape() || ts[i].scalar_type() != ts[0].scalar_type())
      refuse(op, std::string(what) + "[" + std::to_string(i) + "] is " + ts[i].describe() + ", " +
                     what + "[0] is " + ts[0].describe() + "; they must all be alike");
}

work gather_impl(const char* op, process_group& pg, const tensor& x, int dst) {
  check_defined(op, x, "x");
  tensor_list outs;
  for (int q = 0; q < pg.size(); ++q)
    outs.push_back(pg.rank() == dst ? empty_as(x.shape(), x) : detail::zeros_like(x));
  auto w = pg.gather(pg.rank() == dst ? outs : tensor_list{}, x, {.root_rank = dst});
  return with_outputs(w, outs);
}

work scatter_impl(const char* op, process_group& pg, const tensor_list& xs, int src) {
  if (xs.empty()) refuse(op, "no tensors (every rank passes at least one, for the shape)");
  if (pg.rank() == src) {
    check_per_rank(op, pg, xs, "the tensors to scatter");
    check_same_shapes(op, xs, "tensors");
  }
  check_defined(op, xs[0], "the first tensor");
  auto y = empty_as(xs[0].shape(), xs[0]);
  auto w = pg.scatter(y, pg.rank() == src ? xs : tensor_list{}, {.root_rank = src});
  return with_outputs(w, {y});
}

work all_to_all_impl(const char* op, process_group& pg, const tensor_list& xs,
                     const std::vector<shape_t>& shapes) {
  check_per_rank(op, pg, xs, "the tensors to send");
  if (!shapes.empty() && static_cast<int>(shapes.size()) != pg.size())
    refuse(op, "got " + std::to_string(shapes.size()) + " output shapes for " +
                   std::to_string(pg.size()) + " ranks");
  tensor_list ys;
  for (std::size_t q = 0; q < xs.size(); ++q)
    ys.push_back(empty_as(shapes.empty() ? xs[q].shape() : shapes[q], xs[q]));
  return with_outputs(pg.alltoall(ys, xs), ys);
}

/// x's shape with `rows` rows.
shape_t with_rows(const tensor& x, std::int64_t rows) {
  auto s = x.shape();
  s[0] = rows;
  return s;
}

}  // namespace

work broadcast(process_group& pg, const tensor& x, int src) {
  check_defined("broadcast", x, "x");
  auto y = x.clone();
  return with_outputs(pg.broadcast(y, src), {y});
}

work broadcast_backward(process_group& pg, const tensor& grad_y, int src) {
  check_defined("broadcast_backward", grad_y, "grad_y");
  auto g = grad_y.clone();
  const bool root = pg.rank() == src;
  return with_outputs(pg.reduce(g, src, reduce_op::SUM), {g}, [g, root]() mutable {
    if (!root) g.zero_();
  });
}

work gather(process_group& pg, const tensor& x, int dst) {
  return gather_impl("gather", pg, x, dst);
}

work gather_backward(process_group& pg, const tensor_list& grad_ys, int dst) {
  return scatter_impl("gather_backward", pg, grad_ys, dst);
}

work scatter(process_group& pg, const tensor_list& xs, int src) {
  return scatter_impl("scatter", pg, xs, src);
}

work scatter_backward(process_group& pg, const tensor& grad_y, int src) {
  return gather_impl("scatter_backward", pg, grad_y, src);
}

work reduce(process_group& pg, const tensor& x, int dst, reduce_op op) {
  check_linear("reduce", op);
  check_defined("reduce", x, "x");
  auto y = x.clone();
  const bool root = pg.rank() == dst;
  return with_outputs(pg.reduce(y, dst, op), {y}, [y, root]() mutable {
    if (!root) y.zero_();
  });
}

work reduce_backward(process_group& pg, const tensor& grad_y, int dst, reduce_op op) {
  check_linear("reduce_backward", op);
  check_defined("reduce_backward", grad_y, "grad_y");
  auto g = grad_y.clone();
  const double s = adjoint_scale(pg, op);
  return with_outputs(pg.broadcast(g, dst), {g}, [g, s] { scale_all({g}, s); });
}

work reduce_scatter(process_group& pg, const tensor_list& xs, reduce_op op) {
  check_linear("reduce_scatter", op);
  check_per_rank("reduce_scatter", pg, xs, "xs");
  check_same_shapes("reduce_scatter", xs, "xs");
  auto y = empty_as(xs[0].shape(), xs[0]);
  return with_outputs(pg.reduce_scatter(y, xs, {.op = op}), {y});
}

work reduce_scatter_backward(process_group& pg, const tensor& grad_y, reduce_op op) {
  check_linear("reduce_scatter_backward", op);
  check_defined("reduce_scatter_backward", grad_y, "grad_y");
  tensor_list gs;
  for (int q = 0; q < pg.size(); ++q) gs.push_back(empty_as(grad_y.shape(), grad_y));
  const double s = adjoint_scale(pg, op);
  return with_outputs(pg.allgather(gs, grad_y), gs, [gs, s] { scale_all(gs, s); });
}

work all_gather(process_group& pg, const tensor& x) {
  check_defined("all_gather", x, "x");
  tensor_list ys;
  for (int q = 0; q < pg.size(); ++q) ys.push_back(empty_as(x.shape(), x));
  return with_outputs(pg.allgather(ys, x), ys);
}

work all_gather_backward(process_group& pg, const tensor_list& grad_ys) {
  check_per_rank("all_gather_backward", pg, grad_ys, "grad_ys");
  check_same_shapes("all_gather_backward", grad_ys, "grad_ys");
  auto g = empty_as(grad_ys[0].shape(), grad_ys[0]);
  return with_outputs(pg.reduce_scatter(g, grad_ys, {.op = reduce_op::SUM}), {g});
}

work all_gather_into_tensor(process_group& pg, const tensor& x) {
  check_defined("all_gather_into_tensor", x, "x");
  auto shape = x.dim() == 0 ? shape_t{pg.size()} : with_rows(x, x.shape()[0] * pg.size());
  auto y = empty_as(shape, x);
  return with_outputs(pg.allgather_into_tensor(y, x), {y});
}

work all_gather_into_tensor_backward(process_group& pg, const tensor& grad_y) {
  check_defined("all_gather_into_tensor_backward", grad_y, "grad_y");
  if (grad_y.dim() == 0 || grad_y.shape()[0] % pg.size() != 0)
    refuse(
        "all_gather_into_tensor_backward",
        "Tensor with dimensions: " + detail::shape_string(grad_y.shape()) +
            " does not have first dimension divisible by world_size: " + std::to_string(pg.size()));
  auto g = empty_as(with_rows(grad_y, grad_y.shape()[0] / pg.size()), grad_y);
  return with_outputs(pg.reduce_scatter_tensor(g, grad_y, {.op = reduce_op::SUM}), {g});
}

work all_to_all(process_group& pg, const tensor_list& xs, std::vector<shape_t> y_shapes) {
  return all_to_all_impl("all_to_all", pg, xs, y_shapes);
}

work all_to_all_backward(process_group& pg, const tensor_list& grad_ys,
                         std::vector<shape_t> x_shapes) {
  return all_to_all_impl("all_to_all_backward", pg, grad_ys, x_shapes);
}

work all_to_all_single(process_group& pg, const tensor& x, std::vector<std::int64_t> y_splits,
                       std::vector<std::int64_t> x_splits) {
  check_defined("all_to_all_single", x, "x");
  if (x.dim() == 0) refuse("all_to_all_single", "x must have a first dimension, got a scalar");
  std::int64_t rows = x.shape()[0];
  if (!y_splits.empty()) {
    rows = 0;
    for (auto s : y_splits) rows += s;
  }
  auto y = empty_as(with_rows(x, rows), x);
  return with_outputs(pg.alltoall_single(y, x, std::move(y_splits), std::move(x_splits)), {y});
}

work all_to_all_single_backward(process_group& pg, const tensor& grad_y, const shape_t& x_shape,
                                std::vector<std::int64_t> y_splits,
                                std::vector<std::int64_t> x_splits) {
  check_defined("all_to_all_single_backward", grad_y, "grad_y");
  auto g = empty_as(x_shape, grad_y);
  return with_outputs(pg.alltoall_single(g, grad_y, std::move(x_splits), std::move(y_splits)), {g});
}

work all_reduce(process_group& pg, const tensor& x, reduce_op op) {
  check_linear("all_reduce", op);
  check_defined("all_reduce", x, "x");
  auto y = x.clone();
  return with_outputs(pg.allreduce(y, op), {y});
}

work all_reduce_backward(process_group& pg, const tensor& grad_y, reduce_op op) {
  check_linear("all_reduce_backward", op);
  check_defined("all_reduce_backward", grad_y, "grad_y");
  auto g = grad_y.clone();
  return with_outputs(pg.allreduce(g, op), {g});
}

}  // namespace troupe::differentiable
