#pragma once

/// \file
/// SGD with momentum, dampening, Nesterov and weight decay: torch::optim's
/// update rule, run by fused, multi-tensor or per-tensor kernels.

#include <torch/optim/sgd.h>

#include <unordered_map>
#include <utility>
#include <vector>

#include "lamp/optim/optimizer.h"

namespace lamp {
namespace optim {
namespace detail {
/// For SGD with dampening on the fused path: the parameters whose momentum
/// buffer may not have been taken by a step yet, each with a one-element
/// FP32 device flag (shared by a bucket), 1 until a step is taken:
/// parameter -> (parameter, flag).
using FirstSteps = std::unordered_map<const c10::TensorImpl*,
                                      std::pair<torch::Tensor, torch::Tensor>>;
} // namespace detail

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
/// The first step that is taken sets buf = g, as in torch::optim, also when
/// the steps before it were skipped for an overflow. On the fused path that
/// needs no host read: the buffers are made (zero-filled) by the first step,
/// taken or not. Without dampening the ordinary update of a zero buffer is
/// the first step. With dampening each bucket of new buffers gets a device
/// flag, 1 until a step is taken: the first-step kernel and the update
/// kernel are both launched and the flag and the overflow flag let exactly
/// one of them run (one more launch per step, until save() or load() finds
/// the flag 0). save() leaves buffers that no step has taken out of the
/// checkpoint, as torch::optim has none; a captured CUDA graph keeps working
/// on them.
///
/// Example:
/// \code
///   lamp::optim::SGD sgd(model->parameters(),
///                        torch::optim::SGDOptions(0.1).momentum(0.9));
///   scaler.step(sgd);  // fused, skipped on the device on overflow
/// \endcode
class SGD : public FusedOptimizer<torch::optim::SGD> {
 public:
  /// As torch::optim::SGD's constructor, plus the implementation of the
  /// step. Every group's options are checked, here and at each step (a
  /// group added or changed since): options of another optimizer (not
  /// torch::optim::SGDOptions), an lr, momentum, dampening or weight_decay
  /// negative or not finite, or Nesterov without momentum or with dampening
  /// is a TORCH_CHECK error naming the group. kFused where the fused kernels
  /// do not apply is an error at the first step() or implementation() call,
  /// not here: the parameters may still move to their device.
  SGD(std::vector<torch::optim::OptimizerParamGroup> param_groups,
      torch::optim::SGDOptions defaults,
      Implementation implementation = Implementation::kAuto);
  /// The same, with one param group holding `params`.
  SGD(std::vector<torch::Tensor> params, torch::optim::SGDOptions defaults,
      Implementation implementation = Implementation::kAuto);

  /// torch::optim::SGD's format, without the momentum buffers that no step
  /// has taken yet (see above; reads their device flags, a host sync).
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads torch::optim::SGD's format (torch::optim::SGD's checkpoints too).
  /// The state becomes the checkpoint's, as with Python's load_state_dict:
  /// a parameter it holds no buffer for starts its momentum afresh.
  void load(torch::serialize::InputArchive& archive) override;

  void step_scaled(const torch::Tensor& grad_scale,
                   const torch::Tensor& found_inf) override;
  /// momentum, dampening, weight_decay and nesterov.
  void baked_in_options(const torch::optim::OptimizerParamGroup& group,
                        BakedOptionVisitor visit) const override;

 private:
  void run(const torch::Tensor& grad_scale, const torch::Tensor& found_inf);
  // The paths that read the host anyway: the flags of first_steps_ resolved
  // (a buffer that no step has taken is dropped), the map emptied.
  void settle_first_steps();

  // Momentum buffers made with dampening that may not have been taken yet:
  // parameter -> (parameter, flag: 1 until a step is taken).
  mutable detail::FirstSteps first_steps_;
};

} // namespace optim
} // namespace lamp
