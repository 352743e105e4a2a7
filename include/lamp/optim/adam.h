#pragma once

/// \file
/// Adam and AdamW: torch::optim's update rules, run by fused, multi-tensor or
/// per-tensor kernels.

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <unordered_map>
#include <utility>
#include <vector>

#include "lamp/optim/optimizer.h"

namespace lamp {
namespace optim {
namespace detail {
/// The step counts of the fused path, one FP32 tensor per parameter on its
/// device (the fused kernels read the step of the bias corrections there):
/// parameter -> (parameter, its device step count).
using DeviceSteps = std::unordered_map<const c10::TensorImpl*,
                                       std::pair<torch::Tensor, torch::Tensor>>;
} // namespace detail

/// A drop-in torch::optim::Adam (same options, param groups, state and
/// checkpoint format) run by ATen's fused kernel where the LibTorch has it
/// (see Implementation), with GradScaler's scale and overflow flag taken on
/// the device (AmpStep).
///
/// The update (torch::optim's), per parameter p with gradient g at step t:
///  1. g += weight_decay * p;
///  2. m = beta1 * m + (1 - beta1) * g; v = beta2 * v + (1 - beta2) * g^2
///     (AMSGrad: v_max = max(v_max, v), used in place of v below);
///  3. p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
///
/// With the fused kernels the step count t lives on the device (a skipped
/// step does not count); save() writes it back into the state's `step`.
class Adam : public FusedOptimizer<torch::optim::Adam> {
 public:
  /// As torch::optim::Adam's constructor, plus the implementation of the
  /// step. Every group's options are checked, here and at each step (a
  /// group added or changed since): options of another optimizer (not
  /// torch::optim::AdamOptions), an lr, eps or weight_decay negative or not
  /// finite, or a beta outside [0, 1) is a TORCH_CHECK error naming the
  /// group. kFused where the fused kernels do not apply is an error at the
  /// first step() or implementation() call, not here: the parameters may
  /// still move to their device.
  Adam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
       torch::optim::AdamOptions defaults = {},
       Implementation implementation = Implementation::kAuto);
  /// The same, with one param group holding `params`.
  explicit Adam(std::vector<torch::Tensor> params,
                torch::optim::AdamOptions defaults = {},
                Implementation implementation = Implementation::kAuto);

  /// torch::optim::Adam's format, with the step counts the fused path keeps
  /// on the device copied back into each parameter's `step` first (a host
  /// sync), so that a checkpoint loads into torch::optim::Adam too.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads torch::optim::Adam's format (torch::optim::Adam's checkpoints
  /// too); the fused path then starts from the loaded step counts. The
  /// state becomes the checkpoint's, as with Python's load_state_dict: a
  /// parameter it holds no state for starts afresh (torch::optim's load
  /// would keep its old moments).
  void load(torch::serialize::InputArchive& archive) override;

  void step_scaled(const torch::Tensor& grad_scale,
                   const torch::Tensor& found_inf) override;
  /// betas[0], betas[1], eps, weight_decay and amsgrad.
  void baked_in_options(const torch::optim::OptimizerParamGroup& group,
                        BakedOptionVisitor visit) const override;

 private:
  mutable detail::DeviceSteps device_steps_;
};

/// AdamW (decoupled weight decay): as lamp::optim::Adam, but step 1 is
/// p *= 1 - lr * weight_decay instead of an L2 term in the gradient
/// (torch::optim::AdamW's rule; its default weight_decay is 1e-2).
class AdamW : public FusedOptimizer<torch::optim::AdamW> {
 public:
  /// As torch::optim::AdamW's constructor, plus the implementation of the
  /// step; the groups' options (torch::optim::AdamWOptions) and kFused are
  /// checked as in Adam.
  AdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
        torch::optim::AdamWOptions defaults = {},
        Implementation implementation = Implementation::kAuto);
  /// The same, with one param group holding `params`.
  explicit AdamW(std::vector<torch::Tensor> params,
                 torch::optim::AdamWOptions defaults = {},
                 Implementation implementation = Implementation::kAuto);

  /// torch::optim::AdamW's format, with the device step counts copied back
  /// first, as Adam::save().
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads torch::optim::AdamW's format, as Adam::load().
  void load(torch::serialize::InputArchive& archive) override;

  void step_scaled(const torch::Tensor& grad_scale,
                   const torch::Tensor& found_inf) override;
  /// betas[0], betas[1], eps, weight_decay and amsgrad.
  void baked_in_options(const torch::optim::OptimizerParamGroup& group,
                        BakedOptionVisitor visit) const override;

 private:
  mutable detail::DeviceSteps device_steps_;
};

} // namespace optim
} // namespace lamp
