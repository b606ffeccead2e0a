#pragma once
/// Differentiable collectives for LibTorch (what torch.distributed.nn.functional
/// is in Python): each call runs a troupe collective out of place and
/// returns tensors that autograd differentiates through troupe's adjoints
/// (troupe/differentiable.hpp), so a backward runs the collective's adjoint
/// on every rank.
///
///   auto y = troupe_torch::functional::all_reduce(pg, x);  // y = sum over ranks of x
///   (w * y).sum().backward();                            // x.grad = sum over ranks of w
///
/// Every rank must call the same functions in the same order, forward and
/// backward alike. Dense floating tensors (inputs are made contiguous);
/// reductions support SUM and AVG (other ops have no gradient rule and are
/// refused). Rooted forwards give zeros off the root (reduce, gather), so
/// each is a linear map. The calls block until their collective completed.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "troupe/process_group.hpp"
#include "troupe/reduce_op.hpp"

namespace troupe_torch::functional {

/// y_r = x_src.
at::Tensor broadcast(troupe::process_group& pg, const at::Tensor& x, int src);
/// On dst, y[q] = x of rank q; elsewhere zeros (size() tensors).
std::vector<at::Tensor> gather(troupe::process_group& pg, const at::Tensor& x, int dst);
/// y_r = xs[r] of src (xs: size() tensors of one shape; on other ranks they
/// only give the shape).
at::Tensor scatter(troupe::process_group& pg, const std::vector<at::Tensor>& xs, int src);
/// On dst, y = op over ranks of x; elsewhere zeros.
at::Tensor reduce(troupe::process_group& pg, const at::Tensor& x, int dst,
                  troupe::reduce_op op = troupe::reduce_op::SUM);
/// y_r = op over ranks q of xs_q[r] (xs: size() tensors of one shape).
at::Tensor reduce_scatter(troupe::process_group& pg, const std::vector<at::Tensor>& xs,
                          troupe::reduce_op op = troupe::reduce_op::SUM);
/// y[q] = x of rank q.
std::vector<at::Tensor> all_gather(troupe::process_group& pg, const at::Tensor& x);
/// The ranks' x concatenated along the first dimension.
at::Tensor all_gather_into_tensor(troupe::process_group& pg, const at::Tensor& x);
/// y[q] = rank q's xs[rank], shaped y_shapes[q] (empty: as this rank's xs[q]).
std::vector<at::Tensor> all_to_all(troupe::process_group& pg, const std::vector<at::Tensor>& xs,
                                   std::vector<std::vector<std::int64_t>> y_shapes = {});
/// x split along dim 0 by x_splits (rows to each rank), y gathers y_splits
/// rows from each rank (empty: equal parts).
at::Tensor all_to_all_single(troupe::process_group& pg, const at::Tensor& x,
                             std::vector<std::int64_t> y_splits = {},
                             std::vector<std::int64_t> x_splits = {});
/// y = op over ranks of x.
at::Tensor all_reduce(troupe::process_group& pg, const at::Tensor& x,
                      troupe::reduce_op op = troupe::reduce_op::SUM);

}  // namespace troupe_torch::functional
