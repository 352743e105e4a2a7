#include "lamp/optim/optimizer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "lamp/optim/adam.h"
#include "lamp/optim/decay_groups.h"
#include "lamp/optim/sgd.h"
#include "lamp/platform/parameters.h"
#include "optim/internal.h"
#include "platform/compat.h"
#include "platform/cuda_graph.h"

namespace lamp {
namespace optim {

const NameTable<Implementation>& implementation_table() {
  static const NameTable<Implementation> table(
      "optimizer implementation", "optimizer implementations",
      {{"auto", Implementation::kAuto},
       {"fused", Implementation::kFused},
       {"foreach", Implementation::kForEach},
       {"per-tensor", Implementation::kPerTensor}});
  return table;
}

std::string to_string(Implementation implementation) {
  return implementation_table().name(implementation);
}

Implementation parse_implementation(const std::string& name) {
  return implementation_table().parse(name);
}

namespace {

enum class Kind { kSGD, kAdam, kAdamW };

const NameTable<Kind>& optimizer_table() {
  static const NameTable<Kind> table(
      "optimizer", "optimizers",
      {{"sgd", Kind::kSGD}, {"adam", Kind::kAdam}, {"adamw", Kind::kAdamW}});
  return table;
}

} // namespace

const std::vector<std::string>& optimizer_names() {
  return optimizer_table().names();
}

namespace {

// One param group, or two under no_bias_decay: the parameters that
// decays_by_shape() exempts (biases, the weights and biases of norms) in a
// group of their own with no weight decay. Both use `defaults`' other
// options.
template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> param_groups(
    std::vector<torch::Tensor> params, const Options& defaults,
    const OptimizerOptions& options) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!options.no_bias_decay() || options.weight_decay() == 0) {
    groups.emplace_back(std::move(params), std::make_unique<Options>(defaults));
    return groups;
  }
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : params) {
    (decays_by_shape(p) ? decay : no_decay).push_back(std::move(p));
  }
  return detail::groups_by_decay(std::move(decay), std::move(no_decay),
                                 defaults);
}

} // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    std::vector<torch::Tensor> params, const OptimizerOptions& options) {
  const auto kind = optimizer_table().parse(options.name());
  // As Python's optimizers: nothing to train is a mistake upstream (every
  // parameter frozen, or the wrong module), not an optimizer without groups.
  TORCH_CHECK(
      !params.empty(),
      "lamp::optim::make_optimizer: the parameter list is empty; pass the "
      "parameters to train (every one frozen, or another module's list?).");
  TORCH_CHECK(
      options.lr() > 0 && std::isfinite(options.lr()),
      "lamp::optim::make_optimizer: OptimizerOptions::lr must be a positive finite number, got ",
      options.lr(), ".");
  TORCH_CHECK(
      options.momentum() >= 0 && options.weight_decay() >= 0 &&
          std::isfinite(options.momentum()) &&
          std::isfinite(options.weight_decay()),
      "lamp::optim::make_optimizer: OptimizerOptions::momentum and weight_decay must be finite and >= 0, got ",
      options.momentum(), " and ", options.weight_decay(), ".");
  for (const auto& beta : {std::make_pair("beta1", options.beta1()),
                           std::make_pair("beta2", options.beta2())}) {
    TORCH_CHECK(
        beta.second >= 0 && beta.second < 1,
        "lamp::optim::make_optimizer: OptimizerOptions::", beta.first,
        " must be in [0, 1), got ", beta.second,
        "; choose one in that range (Python's defaults: beta1 0.9, beta2 0.999).");
  }
  const auto betas = std::make_tuple(options.beta1(), options.beta2());
  switch (kind) {
    case Kind::kSGD: {
      // Nesterov needs momentum (torch::optim refuses it without).
      const auto defaults =
          torch::optim::SGDOptions(options.lr())
              .momentum(options.momentum())
              .nesterov(options.nesterov() && options.momentum() > 0)
              .weight_decay(options.weight_decay());
      return std::make_unique<SGD>(
          param_groups(std::move(params), defaults, options), defaults,
          options.implementation());
    }
    case Kind::kAdam: {
      const auto defaults = torch::optim::AdamOptions(options.lr())
                                .betas(betas)
                                .weight_decay(options.weight_decay());
      return std::make_unique<Adam>(
          param_groups(std::move(params), defaults, options), defaults,
          options.implementation());
    }
    case Kind::kAdamW: {
      const auto defaults = torch::optim::AdamWOptions(options.lr())
                                .betas(betas)
                                .weight_decay(options.weight_decay());
      return std::make_unique<AdamW>(
          param_groups(std::move(params), defaults, options), defaults,
          options.implementation());
    }
  }
  TORCH_INTERNAL_ASSERT(false, "lamp::optim::make_optimizer: unhandled kind");
}

void AmpStep::set_device_lr(bool enabled) {
  device_lr_enabled_ = enabled;
  device_lr_.clear();
}

torch::Tensor AmpStep::device_lr_for(size_t group, double lr,
                                     const torch::Device& device) {
  if (!device_lr_enabled_) {
    return {};
  }
  auto& tensor = device_lr_[{group, device.str()}];
  if (!tensor.defined()) {
    tensor = torch::full(
        {}, lr, torch::TensorOptions().device(device).dtype(torch::kFloat));
  }
  return tensor;
}

void AmpStep::refresh_device_lr(const torch::optim::Optimizer& self) {
  const auto& groups = self.param_groups();
  for (auto& item : device_lr_) {
    const size_t group = item.first.first;
    TORCH_CHECK(group < groups.size(), "lamp::optim: param group ", group,
                " has a device learning rate but no longer exists.");
    item.second.fill_(groups[group].options().get_lr());
  }
}

template <typename Base>
torch::Tensor FusedOptimizer<Base>::step(
    torch::optim::Optimizer::LossClosure closure) {
  auto loss = internal::run_closure(closure);
  step_scaled(torch::Tensor(), torch::Tensor());
  return loss;
}

template <typename Base>
bool FusedOptimizer<Base>::skips_on_device() const {
  return implementation() == Implementation::kFused;
}

template <typename Base>
void FusedOptimizer<Base>::refresh_device_lr() {
  AmpStep::refresh_device_lr(*this);
}

template <typename Base>
Implementation FusedOptimizer<Base>::implementation() const {
  return internal::resolve(implementation_, *this, caller_);
}

template class FusedOptimizer<torch::optim::SGD>;
template class FusedOptimizer<torch::optim::Adam>;
template class FusedOptimizer<torch::optim::AdamW>;

namespace internal {

std::map<std::pair<std::string, torch::ScalarType>, Bucket> buckets(
    torch::optim::OptimizerParamGroup& group, const char* caller) {
  std::map<std::pair<std::string, torch::ScalarType>, Bucket> out;
  for (auto& p : group.params()) {
    const auto& grad = p.grad();
    if (!grad.defined()) {
      continue;
    }
    TORCH_CHECK(
        !grad.is_sparse(), caller,
        ": the fused and foreach implementations take no sparse gradient; use Implementation::kPerTensor (torch::optim's own step: SGD takes them, Adam does not) or a dense embedding.");
    auto& bucket = out[{p.device().str(), p.scalar_type()}];
    bucket.params.push_back(p);
    bucket.grads.push_back(grad);
  }
  return out;
}

namespace {

bool fused_kernel_for(const torch::Tensor& t) {
  const auto dtype = t.scalar_type();
  return (t.is_cuda() || t.is_cpu()) && !t.is_sparse() &&
         (dtype == torch::kFloat || dtype == torch::kDouble ||
          dtype == torch::kHalf || dtype == torch::kBFloat16);
}

} // namespace

bool fused_applies(const torch::optim::Optimizer& optimizer) {
  if (!lamp::detail::kFusedOptimizers) {
    return false;
  }
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (!fused_kernel_for(p) ||
          (p.grad().defined() && !fused_kernel_for(p.grad()))) {
        return false;
      }
    }
  }
  return true;
}

Implementation resolve(Implementation requested,
                       const torch::optim::Optimizer& optimizer,
                       const char* caller) {
  const bool fused = fused_applies(optimizer);
  if (requested == Implementation::kFused) {
    TORCH_CHECK(
        fused, caller,
        ": the fused implementation needs ATen's fused optimizer kernels (LibTorch >= 2.4) and dense float, double, half or bfloat16 parameters on CPU or CUDA; use Implementation::kAuto, kForEach or kPerTensor here.");
    return requested;
  }
  if (requested != Implementation::kAuto) {
    return requested;
  }
  if (fused) {
    return Implementation::kFused;
  }
  // A sparse gradient (an Embedding with sparse(true)) takes torch::optim's
  // own step, as Python's foreach optimizers fall back for it.
  bool cuda = false;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (p.grad().defined() && p.grad().is_sparse()) {
        return Implementation::kPerTensor;
      }
      cuda = cuda || p.is_cuda();
    }
  }
  return cuda ? Implementation::kForEach : Implementation::kPerTensor;
}

torch::Tensor skip_flag(const torch::Tensor& found_inf) {
  return found_inf.defined() ? found_inf.ne(0).to(found_inf.scalar_type())
                             : found_inf;
}

void check_not_capturing(const torch::Tensor& p, const char* caller) {
  TORCH_CHECK(
      !lamp::detail::stream_capturing(p.device()), caller,
      ": a parameter of shape ", p.sizes(),
      " got its first gradient while a CUDA graph was being captured, so its optimizer state would be made inside the graph; give every trained parameter a gradient in the warm-up steps (lamp::TrainStep captures again when requires_grad changes).");
}

bool prepare_scaled_step(torch::optim::Optimizer& optimizer,
                         const torch::Tensor& grad_scale,
                         const torch::Tensor& found_inf) {
  if (found_inf.defined() && found_inf.item<float>() != 0.0f) {
    return false;
  }
  if (grad_scale.defined()) {
    torch::NoGradGuard no_grad;
    for (auto& group : optimizer.param_groups()) {
      for (auto& p : group.params()) {
        if (p.grad().defined()) {
          p.mutable_grad().div_(grad_scale.to(p.device()));
        }
      }
    }
  }
  return true;
}

std::vector<torch::optim::OptimizerParamGroup> unique_param_groups(
    std::vector<torch::optim::OptimizerParamGroup> groups, const char* caller) {
  std::unordered_map<const c10::TensorImpl*, size_t> group_of;
  for (size_t g = 0; g < groups.size(); ++g) {
    auto& params = groups[g].params();
    params = unique_tensors(std::move(params));
    for (const auto& p : params) {
      const auto first = group_of.emplace(p.unsafeGetTensorImpl(), g).first;
      TORCH_CHECK(
          first->second == g, caller, ": a parameter of shape ", p.sizes(),
          " is in param groups ", first->second, " and ", g,
          "; give each tensor to one group. (A tied weight has one name per registration: build the groups from lamp::unique_named_parameters(model).)");
    }
  }
  return groups;
}

void add_param_groups_as_given(
    torch::optim::Optimizer& optimizer,
    std::vector<torch::optim::OptimizerParamGroup> groups, const char* caller) {
  TORCH_INTERNAL_ASSERT(optimizer.param_groups().empty());
  for (const auto& group : unique_param_groups(std::move(groups), caller)) {
    optimizer.add_param_group(group);
    if (group.has_options()) {
      optimizer.param_groups().back().set_options(group.options().clone());
    }
  }
}

namespace {

// "its options" (one group) or "param group 2's options".
std::string group_name(const torch::optim::Optimizer& optimizer, size_t g) {
  return optimizer.param_groups().size() == 1
             ? "its options"
             : "param group " + std::to_string(g) + "'s options";
}

// Group `g`'s options as `Options`, or an error naming `type`.
template <typename Options>
const Options& options_as(const torch::optim::Optimizer& optimizer, size_t g,
                          const char* caller, const char* type) {
  const auto& group = optimizer.param_groups()[g];
  const auto* options = group.has_options()
                            ? dynamic_cast<const Options*>(&group.options())
                            : nullptr;
  TORCH_CHECK(options != nullptr, caller, ": param group ", g,
              " holds another optimizer's options (or none); give it ", type,
              ", or no options to take the optimizer's defaults.");
  return *options;
}

// A value of group `g`'s options that must be finite and >= 0. (The
// group's name is made only for the message: this runs at every step.)
void check_finite_non_negative(double value, const char* name,
                               const torch::optim::Optimizer& optimizer,
                               size_t g, const char* caller) {
  TORCH_CHECK(std::isfinite(value) && value >= 0, caller, ": ",
              group_name(optimizer, g), " ", name, " is ", value,
              "; give a finite ", name, " >= 0.");
}

template <typename Options>
void check_adam_groups(const torch::optim::Optimizer& optimizer,
                       const char* caller, const char* type) {
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const auto& o = options_as<Options>(optimizer, g, caller, type);
    check_finite_non_negative(o.lr(), "lr", optimizer, g, caller);
    check_finite_non_negative(o.eps(), "eps", optimizer, g, caller);
    check_finite_non_negative(o.weight_decay(), "weight_decay", optimizer, g,
                              caller);
    for (const auto& beta : {std::make_pair(0, std::get<0>(o.betas())),
                             std::make_pair(1, std::get<1>(o.betas()))}) {
      TORCH_CHECK(0 <= beta.second && beta.second < 1, caller, ": ",
                  group_name(optimizer, g), " betas[", beta.first, "] is ",
                  beta.second,
                  "; give one in [0, 1) (Python's defaults: 0.9, 0.999).");
    }
  }
}

} // namespace

void check_param_groups(const torch::optim::SGD& optimizer,
                        const char* caller) {
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const auto& o = options_as<torch::optim::SGDOptions>(
        optimizer, g, caller, "torch::optim::SGDOptions");
    check_finite_non_negative(o.lr(), "lr", optimizer, g, caller);
    check_finite_non_negative(o.momentum(), "momentum", optimizer, g, caller);
    check_finite_non_negative(o.dampening(), "dampening", optimizer, g, caller);
    check_finite_non_negative(o.weight_decay(), "weight_decay", optimizer, g,
                              caller);
    TORCH_CHECK(!o.nesterov() || (o.momentum() > 0 && o.dampening() == 0),
                caller, ": ", group_name(optimizer, g),
                " ask for Nesterov momentum with momentum ", o.momentum(),
                " and dampening ", o.dampening(),
                "; Nesterov needs momentum > 0 and dampening 0.");
  }
}

void check_param_groups(const torch::optim::Adam& optimizer,
                        const char* caller) {
  check_adam_groups<torch::optim::AdamOptions>(optimizer, caller,
                                               "torch::optim::AdamOptions");
}

void check_param_groups(const torch::optim::AdamW& optimizer,
                        const char* caller) {
  check_adam_groups<torch::optim::AdamWOptions>(optimizer, caller,
                                                "torch::optim::AdamWOptions");
}

torch::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) {
    return {};
  }
  torch::AutoGradMode enable_grad(true);
  return closure();
}

} // namespace internal
} // namespace optim
} // namespace lamp
