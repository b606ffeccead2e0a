// troupe_torch::SyncBatchNorm (see troupe_torch/sync_batch_norm.hpp): the
// module as torch.nn.SyncBatchNorm's, an autograd function over troupe's
// sync_batch_norm_forward/backward, and convert_sync_batchnorm.

#include "troupe_torch/sync_batch_norm.hpp"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <ostream>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/sync_batch_norm.hpp"
#include "troupe_torch/tensor.hpp"

namespace troupe_torch {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

[[noreturn]] void refuse(const std::string& what) {
  throw troupe::error(troupe::errc::invalid_argument, "SyncBatchNorm: " + what);
}

/// What the function needs besides its tensors.
struct sync_bn_state : torch::CustomClassHolder {
  troupe::process_group* pg = nullptr;
  at::Tensor running_mean, running_var;  // updated in place; may be undefined
  troupe::sync_batch_norm_options opts;
  std::int64_t count = 0;  // set by the forward
};

troupe::tensor maybe_troupe(const at::Tensor& t) {
  return t.defined() ? to_troupe(t.detach()) : troupe::tensor{};
}

struct sync_bn_function : torch::autograd::Function<sync_bn_function> {
  /// weight and bias are optional (not affine): absent, they are no inputs
  /// of the node (autograd takes no undefined inputs).
  static variable_list forward(AutogradContext* ctx, c10::IValue state, const at::Tensor& input,
                               const c10::optional<at::Tensor>& weight,
                               const c10::optional<at::Tensor>& bias) {
    auto s = c10::static_intrusive_pointer_cast<sync_bn_state>(state.toCapsule());
    auto x = input.contiguous();
    auto w = weight ? weight->contiguous() : at::Tensor();
    auto b = bias ? bias->contiguous() : at::Tensor();
    auto r = troupe::sync_batch_norm_forward(*s->pg, to_troupe(x), maybe_troupe(w), maybe_troupe(b),
                                             maybe_troupe(s->running_mean),
                                             maybe_troupe(s->running_var), s->opts);
    s->count = r.saved.stats.count;
    ctx->saved_data["state"] = std::move(state);
    ctx->save_for_backward({x, w, to_torch(r.saved.stats.mean), to_torch(r.saved.stats.invstd)});
    return {to_torch(r.output)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s =
        c10::static_intrusive_pointer_cast<sync_bn_state>(ctx->saved_data["state"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    troupe::sync_batch_norm_saved sv;
    sv.input = to_troupe(saved[0]);
    sv.weight = maybe_troupe(saved[1]);
    sv.stats = {to_troupe(saved[2]), to_troupe(saved[3]), s->count};
    auto dy = grads[0].defined() ? grads[0].contiguous() : at::zeros_like(saved[0]);
    // The node's inputs: the input, then weight and bias when affine.
    const bool affine = saved[1].defined();
    const std::array<bool, 3> needs{ctx->needs_input_grad(0), affine && ctx->needs_input_grad(1),
                                    affine && ctx->needs_input_grad(2)};
    auto g = troupe::sync_batch_norm_backward(*s->pg, to_troupe(dy), sv, needs);
    auto back = [](const troupe::tensor& t) { return t.defined() ? to_torch(t) : at::Tensor(); };
    return {at::Tensor(), back(g.input), back(g.weight), back(g.bias)};
  }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const SyncBatchNormOptions& options_) : options(options_) {
  reset();
}

SyncBatchNormImpl::SyncBatchNormImpl(const SyncBatchNormOptions& options_, at::Tensor w,
                                     at::Tensor b, at::Tensor mean, at::Tensor var,
                                     at::Tensor batches)
    : options(options_) {
  const auto c = options.num_features();
  auto check = [c](const at::Tensor& t, bool wanted, const char* what) {
    if (wanted && (!t.defined() || t.dim() != 1 || t.size(0) != c))
      refuse(std::string(what) + " must have " + std::to_string(c) + " elements, got " +
             (t.defined() ? std::to_string(t.numel()) : std::string("an undefined tensor")));
  };
  check(w, options.affine(), "weight");
  check(b, options.affine(), "bias");
  check(mean, options.track_running_stats(), "running_mean");
  check(var, options.track_running_stats(), "running_var");
  const bool affine = options.affine(), track = options.track_running_stats();
  weight = register_parameter("weight", affine ? w : at::Tensor(), affine && w.requires_grad());
  bias = register_parameter("bias", affine ? b : at::Tensor(), affine && b.requires_grad());
  running_mean = register_buffer("running_mean", track ? mean : at::Tensor());
  running_var = register_buffer("running_var", track ? var : at::Tensor());
  num_batches_tracked = register_buffer("num_batches_tracked", track ? batches : at::Tensor());
}

void SyncBatchNormImpl::reset() {
  const auto c = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", at::empty({c}));
    bias = register_parameter("bias", at::empty({c}));
  } else {
    weight = register_parameter("weight", at::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", at::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", at::zeros({c}));
    running_var = register_buffer("running_var", at::ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", at::tensor(0, at::kLong));
  } else {
    running_mean = register_buffer("running_mean", at::Tensor());
    running_var = register_buffer("running_var", at::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", at::Tensor());
  }
  reset_parameters();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (options.affine()) {
    torch::nn::init::ones_(weight);
    torch::nn::init::zeros_(bias);
  }
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "troupe_torch::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum())
    stream << *options.momentum();
  else
    stream << "None";
  stream << ", affine=" << std::boolalpha << options.affine()
         << ", track_running_stats=" << options.track_running_stats() << ")";
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  if (input.dim() < 2)
    refuse("expected at least 2D input (got " + std::to_string(input.dim()) + "D input)");
  if (input.size(1) == 0) refuse("number of input channels should be non-zero");
  if (input.size(1) != options.num_features())
    refuse("expected an input of " + std::to_string(options.num_features()) +
           " channels (dimension 1), got " + std::to_string(input.size(1)));

  double factor = options.momentum() ? *options.momentum() : 0.0;
  if (is_training() && options.track_running_stats()) {
    num_batches_tracked.add_(1);
    if (!options.momentum()) factor = 1.0 / num_batches_tracked.item<double>();
  }
  // Batch statistics in training, and in eval mode without running statistics.
  const bool bn_training = is_training() || (!running_mean.defined() && !running_var.defined());
  const bool keep = !is_training() || options.track_running_stats();
  const auto rm = keep ? running_mean : at::Tensor();
  const auto rv = keep ? running_var : at::Tensor();

  auto* pg = options.process_group();
  if (!(bn_training && is_training() && pg && pg->size() > 1))
    return torch::nn::functional::detail::batch_norm(input, rm, rv, weight, bias, bn_training,
                                                     factor, options.eps());

  auto state = c10::make_intrusive<sync_bn_state>();
  state->pg = pg;
  state->running_mean = rm;
  state->running_var = rv;
  state->opts.eps = options.eps();
  state->opts.momentum = factor;
  auto maybe = [](const at::Tensor& t) {
    return t.defined() ? c10::optional<at::Tensor>(t) : c10::optional<at::Tensor>();
  };
  return sync_bn_function::apply(c10::IValue::make_capsule(std::move(state)), input, maybe(weight),
                                 maybe(bias))[0];
}

namespace {

/// The replacement of a batch norm, or nullptr when `m` is none.
template <class BN>
std::shared_ptr<SyncBatchNormImpl> as_sync(const std::shared_ptr<torch::nn::Module>& m,
                                           troupe::process_group& pg) {
  auto bn = std::dynamic_pointer_cast<BN>(m);
  if (!bn) return nullptr;
  const auto& o = bn->options;
  // The same tensors, as torch assigns the same Parameter and buffer objects.
  return std::make_shared<SyncBatchNormImpl>(SyncBatchNormOptions(o.num_features())
                                                 .eps(o.eps())
                                                 .momentum(o.momentum())
                                                 .affine(o.affine())
                                                 .track_running_stats(o.track_running_stats())
                                                 .process_group(&pg),
                                             bn->weight, bn->bias, bn->running_mean,
                                             bn->running_var, bn->num_batches_tracked);
}

struct converter {
  troupe::process_group& pg;
  std::vector<std::shared_ptr<SyncBatchNormImpl>> made;

  /// The module to use in place of `m` (m itself when changed in place).
  std::shared_ptr<torch::nn::Module> convert(const std::shared_ptr<torch::nn::Module>& m) {
    std::shared_ptr<SyncBatchNormImpl> sync = as_sync<torch::nn::BatchNorm1dImpl>(m, pg);
    if (!sync) sync = as_sync<torch::nn::BatchNorm2dImpl>(m, pg);
    if (!sync) sync = as_sync<torch::nn::BatchNorm3dImpl>(m, pg);
    if (sync) {
      made.push_back(sync);
      return sync;
    }
    if (auto seq = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(m)) return rebuild(*seq);
    if (auto list = std::dynamic_pointer_cast<torch::nn::ModuleListImpl>(m)) return rebuild(*list);
    if (auto dict = std::dynamic_pointer_cast<torch::nn::ModuleDictImpl>(m)) {
      for (const auto& [key, child] : dict->items()) {
        auto c = convert(child);
        if (c != child)
          dict->update(
              std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>{{key, c}});
      }
      return m;
    }
    for (const auto& item : m->named_children()) {
      auto c = convert(item.value());
      if (c != item.value()) m->replace_module(item.key(), c);
    }
    return m;
  }

  /// A new container holding the converted children under their names.
  template <class C>
  std::shared_ptr<torch::nn::Module> rebuild(C& old) {
    std::shared_ptr<C> fresh = std::make_shared<C>();
    bool changed = false;
    std::size_t k = 0;
    for (const auto& item : old.named_children()) {
      auto c = convert(item.value());
      changed = changed || c != item.value();
      if constexpr (std::is_same_v<C, torch::nn::SequentialImpl>) {
        auto any = old.begin()[static_cast<std::ptrdiff_t>(k)];
        fresh->push_back(item.key(), c == item.value() ? any : any_of(c));
      } else {
        fresh->push_back(c);
      }
      ++k;
    }
    if (!changed) return old.shared_from_this();
    if (!old.is_training()) fresh->train(false);
    return fresh;
  }

  /// A replaced child of a Sequential (only a batch norm: a Sequential holds
  /// modules with one forward, which ModuleList and Sequential have not).
  static torch::nn::AnyModule any_of(const std::shared_ptr<torch::nn::Module>& c) {
    if (auto s = std::dynamic_pointer_cast<SyncBatchNormImpl>(c)) return torch::nn::AnyModule(s);
    throw troupe::error(troupe::errc::internal,
                        "convert_sync_batchnorm: no forward for a rebuilt " + c->name());
  }
};

}  // namespace

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          troupe::process_group& pg) {
  if (!module)
    throw troupe::error(troupe::errc::invalid_argument, "convert_sync_batchnorm: null module");
  converter c{pg, {}};
  auto r = c.convert(module);
  for (auto& s : c.made) s->train(true);  // as torch's: new modules train
  return r;
}

}  // namespace troupe_torch
