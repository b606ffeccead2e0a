#pragma once
/// Differentiable collectives (torch.distributed.nn.functional) without an
/// autograd engine: every collective A has an out-of-place forward, which
/// returns new tensors and leaves its inputs alone, and a backward, which
/// applies the adjoint Aᵀ to the gradients of the forward's outputs:
///
///   sum over ranks of <A(x)_r, y_r>  ==  sum over ranks of <x_r, Aᵀ(y)_r>
///
/// Both return a work whose result() holds the new tensors; nothing blocks.
/// The backward takes what the forward was called with (roots, op, shapes),
/// so a framework can call it from its own autograd function.
///
/// Rooted forwards define their output off the root as zeros (reduce, and
/// gather's list), so that each collective is a linear map with a well-defined
/// adjoint. Reductions support SUM and AVG; other ops (MAX, PRODUCT, ...) have
/// no gradient rule here and are refused with errc::invalid_argument naming
/// the op. (The seed applies the SUM rule whatever the op, and its reduce and
/// reduce_scatter backward ignore AVG's 1/n.)

#include <cstdint>
#include <vector>

#include "troupe/process_group.hpp"
#include "troupe/reduce_op.hpp"
#include "troupe/tensor.hpp"
#include "troupe/work.hpp"

namespace troupe::differentiable {

/// y_r = x_src. result: {y}.
work broadcast(process_group& pg, const tensor& x, int src);
/// grad_x = sum over ranks of grad_y on src, zeros elsewhere. result: {grad_x}.
work broadcast_backward(process_group& pg, const tensor& grad_y, int src);

/// On dst, y[q] = x_q for every rank q; elsewhere zeros. result: size() tensors.
work gather(process_group& pg, const tensor& x, int dst);
/// grad_x on rank q = grad_ys[q] of dst (scattered). grad_ys: size() tensors
/// (read on dst only). result: {grad_x}.
work gather_backward(process_group& pg, const tensor_list& grad_ys, int dst);

/// y_r = xs[r] of src. xs: size() tensors of one shape on src; elsewhere at
/// least one tensor giving the shape and dtype (its data is not read). result: {y}.
work scatter(process_group& pg, const tensor_list& xs, int src);
/// On src, grad_xs[q] = grad_y of rank q (gathered); elsewhere zeros.
/// result: size() tensors.
work scatter_backward(process_group& pg, const tensor& grad_y, int src);

/// On dst, y = op over ranks of x; elsewhere zeros. result: {y}.
work reduce(process_group& pg, const tensor& x, int dst, reduce_op op = reduce_op::SUM);
/// grad_x = grad_y of dst (broadcast), times 1/size() for AVG. result: {grad_x}.
work reduce_backward(process_group& pg, const tensor& grad_y, int dst,
                     reduce_op op = reduce_op::SUM);

/// y_r = op over ranks q of xs_q[r]. xs: size() tensors of one shape. result: {y}.
work reduce_scatter(process_group& pg, const tensor_list& xs, reduce_op op = reduce_op::SUM);
/// grad_xs[q] = grad_y of rank q (all-gathered), times 1/size() for AVG.
/// result: size() tensors.
work reduce_scatter_backward(process_group& pg, const tensor& grad_y,
                             reduce_op op = reduce_op::SUM);

/// y[q] = x_q on every rank. result: size() tensors.
work all_gather(process_group& pg, const tensor& x);
/// grad_x = sum over ranks r of grad_ys_r[rank] (reduce-scattered). result: {grad_x}.
work all_gather_backward(process_group& pg, const tensor_list& grad_ys);

/// y = the ranks' x concatenated along the first dimension (a scalar x gives
/// a vector of size()). result: {y}.
work all_gather_into_tensor(process_group& pg, const tensor& x);
/// grad_x = this rank's block of the sum over ranks of grad_y (reduce-scatter).
/// grad_y's first dimension must be divisible by size() ("Tensor with
/// dimensions: [3] does not have first dimension divisible by world_size: 2").
/// result: {grad_x}.
work all_gather_into_tensor_backward(process_group& pg, const tensor& grad_y);

/// y[q] = xs_q[rank] (rank q's tensor for this rank). y[q] has shape
/// y_shapes[q]; empty y_shapes: y[q] is shaped as xs[q] (every rank sends
/// tensors shaped as it receives). result: size() tensors.
work all_to_all(process_group& pg, const tensor_list& xs, std::vector<shape_t> y_shapes = {});
/// grad_xs[q] = grad_ys_q[rank], shaped as the forward's xs (x_shapes; empty:
/// as grad_ys). result: size() tensors.
work all_to_all_backward(process_group& pg, const tensor_list& grad_ys,
                         std::vector<shape_t> x_shapes = {});

/// alltoall_single out of place: x is split along its first dimension by
/// x_splits (rows to each rank), y gathers y_splits rows from each rank
/// (empty splits: equal parts). result: {y}.
work all_to_all_single(process_group& pg, const tensor& x, std::vector<std::int64_t> y_splits = {},
                       std::vector<std::int64_t> x_splits = {});
/// The same exchange backwards: grad_y split by y_splits, grad_x (shaped as x,
/// x_shape) gathered by x_splits. result: {grad_x}.
work all_to_all_single_backward(process_group& pg, const tensor& grad_y, const shape_t& x_shape,
                                std::vector<std::int64_t> y_splits = {},
                                std::vector<std::int64_t> x_splits = {});

/// y = op over ranks of x on every rank. result: {y}.
work all_reduce(process_group& pg, const tensor& x, reduce_op op = reduce_op::SUM);
/// grad_x = all_reduce(grad_y, op): the same op (SUM or AVG). result: {grad_x}.
work all_reduce_backward(process_group& pg, const tensor& grad_y, reduce_op op = reduce_op::SUM);

}  // namespace troupe::differentiable
