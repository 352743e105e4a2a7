#include "lamp/optim/optimizer.h"

#include <torch/torch.h>

#include <algorithm>

#include "lamp/optim/adam.h"
#include "lamp/optim/sgd.h"
#include "optim/internal.h"
#include "platform/compat.h"

namespace lamp {
namespace optim {

std::string to_string(Implementation implementation) {
  switch (implementation) {
    case Implementation::kAuto:
      return "auto";
    case Implementation::kFused:
      return "fused";
    case Implementation::kForEach:
      return "foreach";
    case Implementation::kPerTensor:
      return "per-tensor";
  }
  TORCH_INTERNAL_ASSERT(false, "unknown lamp::optim::Implementation");
}

Implementation parse_implementation(const std::string& name) {
  for (auto implementation :
       {Implementation::kAuto, Implementation::kFused, Implementation::kForEach,
        Implementation::kPerTensor}) {
    if (name == to_string(implementation)) {
      return implementation;
    }
  }
  TORCH_CHECK(false, "lamp::optim: unknown optimizer implementation '", name,
              "'; valid ones are auto, fused, foreach and per-tensor.");
}

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = {"sgd", "adam", "adamw"};
  return names;
}

namespace {

// One param group, or two under no_bias_decay: the parameters with at most
// one dimension (biases, the weights and biases of norms) in a group of
// their own with no weight decay. Both use `defaults`' other options.
template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> param_groups(
    std::vector<torch::Tensor> params, const Options& defaults,
    const OptimizerConfig& config) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!config.no_bias_decay() || config.weight_decay() == 0) {
    groups.emplace_back(std::move(params), std::make_unique<Options>(defaults));
    return groups;
  }
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : params) {
    (p.dim() <= 1 ? no_decay : decay).push_back(std::move(p));
  }
  if (!decay.empty()) {
    groups.emplace_back(std::move(decay), std::make_unique<Options>(defaults));
  }
  if (!no_decay.empty()) {
    auto options = std::make_unique<Options>(defaults);
    options->weight_decay(0.0);
    groups.emplace_back(std::move(no_decay), std::move(options));
  }
  return groups;
}

} // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    std::vector<torch::Tensor> params, const OptimizerConfig& config) {
  const auto& name = config.name();
  if (name == "sgd") {
    const auto defaults = torch::optim::SGDOptions(config.lr())
                              .momentum(config.momentum())
                              .nesterov(config.nesterov())
                              .weight_decay(config.weight_decay());
    return std::make_unique<SGD>(
        param_groups(std::move(params), defaults, config), defaults,
        config.implementation());
  }
  if (name == "adam") {
    const auto defaults = torch::optim::AdamOptions(config.lr())
                              .weight_decay(config.weight_decay());
    return std::make_unique<Adam>(
        param_groups(std::move(params), defaults, config), defaults,
        config.implementation());
  }
  if (name == "adamw") {
    const auto defaults = torch::optim::AdamWOptions(config.lr())
                              .weight_decay(config.weight_decay());
    return std::make_unique<AdamW>(
        param_groups(std::move(params), defaults, config), defaults,
        config.implementation());
  }
  TORCH_CHECK(false, "lamp::optim::make_optimizer: unknown optimizer '", name,
              "'; valid ones are sgd, adam and adamw.");
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

namespace internal {

std::map<std::pair<std::string, torch::ScalarType>, Bucket> buckets(
    torch::optim::OptimizerParamGroup& group, const char* caller) {
  std::map<std::pair<std::string, torch::ScalarType>, Bucket> out;
  for (auto& p : group.params()) {
    const auto& grad = p.grad();
    if (!grad.defined()) {
      continue;
    }
    TORCH_CHECK(!grad.is_sparse(), caller,
                ": sparse gradients are not supported; use a dense "
                "embedding or torch::optim's SparseAdam.");
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
    TORCH_CHECK(fused, caller,
                ": the fused implementation needs ATen's fused optimizer "
                "kernels (LibTorch >= 2.4) and dense float, double, half or "
                "bfloat16 parameters on CPU or CUDA; use "
                "Implementation::kAuto, kForEach or kPerTensor here.");
    return requested;
  }
  if (requested != Implementation::kAuto) {
    return requested;
  }
  if (fused) {
    return Implementation::kFused;
  }
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (p.is_cuda()) {
        return Implementation::kForEach;
      }
    }
  }
  return Implementation::kPerTensor;
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
