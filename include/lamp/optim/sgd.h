#pragma once

/// \file
/// SGD with momentum, dampening, Nesterov and weight decay: torch::optim's
/// update rule, run by fused, multi-tensor or per-tensor kernels.

#include <torch/optim/sgd.h>

#include <vector>

#include "lamp/optim/optimizer.h"

namespace lamp {
namespace optim {

/// A drop-in torch::optim::SGD (same options, param groups, state and
/// checkpoint format) whose step runs as one fused kernel per (device,
/// dtype) group where the LibTorch has it (see Implementation), and that can
/// take GradScaler's scale and overflow flag on the device (AmpStep).
///
/// The update, for each parameter p with gradient g (torch::optim's):
///  1. g += weight_decay * p;
///  2. with momentum: buf = g on the first step, else
///     buf = momentum * buf + (1 - dampening) * g; then g = g + momentum *
///     buf (Nesterov) or g = buf;
///  3. p -= lr * g.
///
/// Momentum buffers are created (zero-filled) and registered only by a step
/// that is taken: a first step skipped for an overflow leaves no buffer
/// behind, so the next taken step is the "first" one, as in torch::optim.
/// (Deciding that needs one host read of the overflow flag, on the first
/// steps only.)
///
/// Example:
/// \code
///   lamp::optim::SGD sgd(model->parameters(),
///                        torch::optim::SGDOptions(0.1).momentum(0.9));
///   scaler.step(sgd);  // fused, skipped on the device on overflow
/// \endcode
class SGD : public torch::optim::SGD, public AmpStep {
 public:
  /// As torch::optim::SGD's constructor (which checks the options), plus the
  /// implementation of the step. kFused where the fused kernels do not apply
  /// is a TORCH_CHECK error at the first step() or implementation() call,
  /// not here: the parameters may still move to their device.
  SGD(std::vector<torch::optim::OptimizerParamGroup> param_groups,
      torch::optim::SGDOptions defaults,
      Implementation implementation = Implementation::kAuto);
  /// The same, with one param group holding `params`.
  SGD(std::vector<torch::Tensor> params, torch::optim::SGDOptions defaults,
      Implementation implementation = Implementation::kAuto);

  /// One update of every parameter with a gradient, through implementation().
  /// `closure`, if given, runs first with grad mode on (as in torch::optim)
  /// and its loss is returned; otherwise returns an undefined tensor.
  torch::Tensor step(LossClosure closure = nullptr) override;

  bool skips_on_device() const override;
  void step_scaled(const torch::Tensor& grad_scale,
                   const torch::Tensor& found_inf) override;
  void refresh_device_lr() override;

  /// The implementation requested at construction.
  Implementation requested_implementation() const { return implementation_; }
  /// What step() runs for the current parameters (kAuto resolved).
  Implementation implementation() const;

 private:
  void run(const torch::Tensor& grad_scale, const torch::Tensor& found_inf);

  Implementation implementation_;
};

} // namespace optim
} // namespace lamp
