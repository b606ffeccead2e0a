// Differentiable collectives for LibTorch: torch::autograd::Functions whose
// forward and backward are troupe's out-of-place collectives and adjoints
// (troupe/differentiable.hpp). Tensors cross without a copy
// (troupe_torch/tensor.hpp); the group travels through the autograd
// context as an address.

#include "troupe_torch/functional.hpp"

#include <torch/csrc/autograd/custom_function.h>

#include <ATen/Functions.h>

#include "troupe/differentiable.hpp"
#include "troupe/error.hpp"
#include "troupe_torch/tensor.hpp"

namespace troupe_torch::functional {
namespace {

namespace diff = troupe::differentiable;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

troupe::process_group& group_of(AutogradContext* ctx) {
  return *reinterpret_cast<troupe::process_group*>(ctx->saved_data["pg"].toInt());
}

void save_group(AutogradContext* ctx, troupe::process_group* pg) {
  ctx->saved_data["pg"] = reinterpret_cast<std::int64_t>(pg);
}

troupe::tensor in(const at::Tensor& t, const char* op, const std::string& what) {
  if (!t.defined())
    throw troupe::error(troupe::errc::invalid_argument,
                        std::string(op) + ": " + what + " is undefined");
  return to_troupe_dense(t.detach().contiguous(), op, what);
}

troupe::tensor_list in(at::TensorList ts, const char* op, const std::string& what) {
  troupe::tensor_list r;
  for (std::size_t i = 0; i < ts.size(); ++i)
    r.push_back(in(ts[i], op, what + " " + std::to_string(i)));
  return r;
}

/// A gradient autograd left undefined (an output that took no part) is zero.
at::Tensor grad_or_zeros(const at::Tensor& g, const at::Tensor& like) {
  return g.defined() ? g : at::zeros_like(like);
}

variable_list out(const troupe::work& w) {
  variable_list r;
  for (auto& t : w.result()) r.push_back(to_torch(t));
  return r;
}

at::Tensor out1(const troupe::work& w) {
  return to_torch(w.result().at(0));
}

std::int64_t op_code(const troupe::reduce_op& op) {
  if (op.op() == troupe::reduce_op::PREMUL_SUM)
    throw troupe::error(
        troupe::errc::invalid_argument,
        "troupe_torch.functional: PREMUL_SUM has no gradient rule here; use SUM or AVG");
  return static_cast<std::int64_t>(op.op());
}

troupe::reduce_op op_of(AutogradContext* ctx) {
  return troupe::reduce_op(static_cast<troupe::reduce_op::kind>(ctx->saved_data["op"].toInt()));
}

// -- the functions ----------------------------------------------------------------------

struct broadcast_fn : torch::autograd::Function<broadcast_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, troupe::process_group* pg,
                            std::int64_t src) {
    save_group(ctx, pg);
    ctx->saved_data["src"] = src;
    return out1(diff::broadcast(*pg, in(x, "broadcast", "x"), static_cast<int>(src)));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto& pg = group_of(ctx);
    auto gx = diff::broadcast_backward(pg, in(g[0], "broadcast.backward", "gradient"),
                                       static_cast<int>(ctx->saved_data["src"].toInt()));
    return {out1(gx), {}, {}};
  }
};

struct gather_fn : torch::autograd::Function<gather_fn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, troupe::process_group* pg,
                               std::int64_t dst) {
    save_group(ctx, pg);
    ctx->saved_data["dst"] = dst;
    ctx->saved_data["like"] = x.detach();
    return out(diff::gather(*pg, in(x, "gather", "x"), static_cast<int>(dst)));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto like = ctx->saved_data["like"].toTensor();
    for (auto& t : g) t = grad_or_zeros(t, like);
    auto gx = diff::gather_backward(group_of(ctx), in(g, "gather.backward", "gradient"),
                                    static_cast<int>(ctx->saved_data["dst"].toInt()));
    return {out1(gx), {}, {}};
  }
};

struct scatter_fn : torch::autograd::Function<scatter_fn> {
  static at::Tensor forward(AutogradContext* ctx, at::TensorList xs, troupe::process_group* pg,
                            std::int64_t src) {
    save_group(ctx, pg);
    ctx->saved_data["src"] = src;
    ctx->saved_data["n"] = static_cast<std::int64_t>(xs.size());
    return out1(diff::scatter(*pg, in(xs, "scatter", "tensor"), static_cast<int>(src)));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto gxs = out(diff::scatter_backward(group_of(ctx), in(g[0], "scatter.backward", "gradient"),
                                          static_cast<int>(ctx->saved_data["src"].toInt())));
    // One gradient per input tensor (off the root, the inputs only gave the shape).
    const auto n = static_cast<std::size_t>(ctx->saved_data["n"].toInt());
    variable_list r;
    for (std::size_t i = 0; i < n; ++i) r.push_back(i < gxs.size() ? gxs[i] : at::Tensor());
    r.emplace_back();
    r.emplace_back();
    return r;
  }
};

struct reduce_fn : torch::autograd::Function<reduce_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, troupe::process_group* pg,
                            std::int64_t dst, std::int64_t op) {
    save_group(ctx, pg);
    ctx->saved_data["dst"] = dst;
    ctx->saved_data["op"] = op;
    return out1(diff::reduce(*pg, in(x, "reduce", "x"), static_cast<int>(dst), op_of(ctx)));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto gx = diff::reduce_backward(group_of(ctx), in(g[0], "reduce.backward", "gradient"),
                                    static_cast<int>(ctx->saved_data["dst"].toInt()), op_of(ctx));
    return {out1(gx), {}, {}, {}};
  }
};

struct reduce_scatter_fn : torch::autograd::Function<reduce_scatter_fn> {
  static at::Tensor forward(AutogradContext* ctx, at::TensorList xs, troupe::process_group* pg,
                            std::int64_t op) {
    save_group(ctx, pg);
    ctx->saved_data["op"] = op;
    return out1(diff::reduce_scatter(*pg, in(xs, "reduce_scatter", "tensor"), op_of(ctx)));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto r = out(diff::reduce_scatter_backward(
        group_of(ctx), in(g[0], "reduce_scatter.backward", "gradient"), op_of(ctx)));
    r.emplace_back();
    r.emplace_back();
    return r;
  }
};

struct all_gather_fn : torch::autograd::Function<all_gather_fn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               troupe::process_group* pg) {
    save_group(ctx, pg);
    ctx->saved_data["like"] = x.detach();
    return out(diff::all_gather(*pg, in(x, "all_gather", "x")));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto like = ctx->saved_data["like"].toTensor();
    for (auto& t : g) t = grad_or_zeros(t, like);
    return {
        out1(diff::all_gather_backward(group_of(ctx), in(g, "all_gather.backward", "gradient"))),
        {}};
  }
};

struct all_gather_into_tensor_fn : torch::autograd::Function<all_gather_into_tensor_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, troupe::process_group* pg) {
    save_group(ctx, pg);
    return out1(diff::all_gather_into_tensor(*pg, in(x, "all_gather_into_tensor", "x")));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {out1(diff::all_gather_into_tensor_backward(
                group_of(ctx), in(g[0], "all_gather_into_tensor.backward", "gradient"))),
            {}};
  }
};

std::vector<troupe::shape_t> to_shapes(const std::vector<std::vector<std::int64_t>>& v) {
  return {v.begin(), v.end()};
}

struct all_to_all_fn : torch::autograd::Function<all_to_all_fn> {
  static variable_list forward(AutogradContext* ctx, at::TensorList xs, troupe::process_group* pg,
                               std::vector<std::vector<std::int64_t>> y_shapes) {
    save_group(ctx, pg);
    // The backward sends each gradient back shaped as the forward's inputs.
    c10::List<c10::List<std::int64_t>> x_shapes;
    for (const auto& x : xs) x_shapes.push_back(c10::List<std::int64_t>(x.sizes().vec()));
    ctx->saved_data["x_shapes"] = x_shapes;
    auto ys = out(diff::all_to_all(*pg, in(xs, "all_to_all", "tensor"), to_shapes(y_shapes)));
    variable_list like;
    for (auto& y : ys) like.push_back(y.detach());
    ctx->saved_data["ys"] = like;
    return ys;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto ys = ctx->saved_data["ys"].toTensorVector();
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = grad_or_zeros(g[i], ys[i]);
    std::vector<troupe::shape_t> x_shapes;
    for (const auto& s : ctx->saved_data["x_shapes"].toList())
      x_shapes.push_back(s.get().toIntVector());
    auto r = out(diff::all_to_all_backward(group_of(ctx), in(g, "all_to_all.backward", "gradient"),
                                           x_shapes));
    r.emplace_back();
    r.emplace_back();
    return r;
  }
};

struct all_to_all_single_fn : torch::autograd::Function<all_to_all_single_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, troupe::process_group* pg,
                            std::vector<std::int64_t> y_splits,
                            std::vector<std::int64_t> x_splits) {
    save_group(ctx, pg);
    ctx->saved_data["x_shape"] = x.sizes().vec();
    ctx->saved_data["y_splits"] = y_splits;
    ctx->saved_data["x_splits"] = x_splits;
    return out1(diff::all_to_all_single(*pg, in(x, "all_to_all_single", "x"), y_splits, x_splits));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto gx = diff::all_to_all_single_backward(
        group_of(ctx), in(g[0], "all_to_all_single.backward", "gradient"),
        ctx->saved_data["x_shape"].toIntVector(), ctx->saved_data["y_splits"].toIntVector(),
        ctx->saved_data["x_splits"].toIntVector());
    return {out1(gx), {}, {}, {}};
  }
};

struct all_reduce_fn : torch::autograd::Function<all_reduce_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, troupe::process_group* pg,
                            std::int64_t op) {
    save_group(ctx, pg);
    ctx->saved_data["op"] = op;
    return out1(diff::all_reduce(*pg, in(x, "all_reduce", "x"), op_of(ctx)));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto gx = diff::all_reduce_backward(group_of(ctx), in(g[0], "all_reduce.backward", "gradient"),
                                        op_of(ctx));
    return {out1(gx), {}, {}};
  }
};

}  // namespace

at::Tensor broadcast(troupe::process_group& pg, const at::Tensor& x, int src) {
  return broadcast_fn::apply(x, &pg, std::int64_t{src});
}

std::vector<at::Tensor> gather(troupe::process_group& pg, const at::Tensor& x, int dst) {
  return gather_fn::apply(x, &pg, std::int64_t{dst});
}

at::Tensor scatter(troupe::process_group& pg, const std::vector<at::Tensor>& xs, int src) {
  return scatter_fn::apply(at::TensorList(xs), &pg, std::int64_t{src});
}

at::Tensor reduce(troupe::process_group& pg, const at::Tensor& x, int dst, troupe::reduce_op op) {
  return reduce_fn::apply(x, &pg, std::int64_t{dst}, op_code(op));
}

at::Tensor reduce_scatter(troupe::process_group& pg, const std::vector<at::Tensor>& xs,
                          troupe::reduce_op op) {
  return reduce_scatter_fn::apply(at::TensorList(xs), &pg, op_code(op));
}

std::vector<at::Tensor> all_gather(troupe::process_group& pg, const at::Tensor& x) {
  return all_gather_fn::apply(x, &pg);
}

at::Tensor all_gather_into_tensor(troupe::process_group& pg, const at::Tensor& x) {
  return all_gather_into_tensor_fn::apply(x, &pg);
}

std::vector<at::Tensor> all_to_all(troupe::process_group& pg, const std::vector<at::Tensor>& xs,
                                   std::vector<std::vector<std::int64_t>> y_shapes) {
  return all_to_all_fn::apply(at::TensorList(xs), &pg, std::move(y_shapes));
}

at::Tensor all_to_all_single(troupe::process_group& pg, const at::Tensor& x,
                             std::vector<std::int64_t> y_splits,
                             std::vector<std::int64_t> x_splits) {
  return all_to_all_single_fn::apply(x, &pg, std::move(y_splits), std::move(x_splits));
}

at::Tensor all_reduce(troupe::process_group& pg, const at::Tensor& x, troupe::reduce_op op) {
  return all_reduce_fn::apply(x, &pg, op_code(op));
}

}  // namespace troupe_torch::functional
