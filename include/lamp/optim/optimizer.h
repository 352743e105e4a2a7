#pragma once

/// \file
/// What lamp's optimizers (lamp::optim::SGD, Adam, AdamW) have in common: how
/// they run their update, and the on-device step that GradScaler uses to
/// skip overflowing steps without a host sync.

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

// After LibTorch's headers: 1.13's FunctionRef.h uses c10::invoke_result_t
// without including its header.
#include <c10/util/FunctionRef.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lamp/platform/names.h"

namespace lamp {
namespace optim {

/// How a lamp optimizer runs its update. Every implementation follows
/// torch::optim's update rule; they differ in how many kernels they launch
/// and in rounding (see each one).
enum class Implementation {
  /// kFused where this LibTorch has the fused kernels for the parameters'
  /// device and dtype (LibTorch >= 2.4, CPU or CUDA), otherwise kForEach on
  /// CUDA and kPerTensor on CPU; kPerTensor for a step with a sparse
  /// gradient (as Python's foreach optimizers fall back for one).
  kAuto,
  /// ATen's fused kernels (`_fused_sgd_`, `_fused_adam_`, `_fused_adamw_`):
  /// one kernel launch per (device, dtype) group of parameters, computed in
  /// FP32 (the "opmath" type), with unscaling and the skip decision inside
  /// the kernel. Rounds differently from torch::optim in the last bits.
  kFused,
  /// Multi-tensor `at::_foreach_*` ops (Python's default): a few launches
  /// per (device, dtype) group, the same elementwise math as torch::optim.
  kForEach,
  /// torch::optim's own per-parameter loop: bit for bit torch::optim.
  kPerTensor,
};

/// The spellings of the implementations: "auto", "fused", "foreach",
/// "per-tensor".
const NameTable<Implementation>& implementation_table();
/// "auto", "fused", "foreach", "per-tensor".
std::string to_string(Implementation implementation);
/// Parses to_string()'s spellings; anything else is an error listing them.
Implementation parse_implementation(const std::string& name);

/// The step GradScaler calls for an optimizer that can take the loss
/// scaler's state on the device: unscaling, the skip decision and the state
/// updates then need no host sync, so a training step can run ahead of the
/// GPU (and be captured in a CUDA graph). lamp's SGD, Adam and AdamW
/// implement it; GradScaler falls back to its synchronous unscale, read and
/// step for every other optimizer.
class AmpStep {
 public:
  virtual ~AmpStep() = default;

  /// Whether step_scaled() decides on the device, without a host sync, for
  /// the optimizer's current parameters (true with the fused kernels).
  virtual bool skips_on_device() const = 0;

  /// One optimizer step over gradients that may still be scaled:
  ///  1. where `found_inf` is non-zero the whole step is skipped: parameters
  ///     and optimizer state (momentum, moments, step counts) stay as they
  ///     were, and the gradients stay scaled;
  ///  2. otherwise, where `grad_scale` is defined, every gradient is divided
  ///     by it (in place: after the step they are the unscaled ones), then
  ///     the update runs.
  /// Both are one-element FP32 tensors on the parameters' device.
  virtual void step_scaled(const torch::Tensor& grad_scale,
                           const torch::Tensor& found_inf) = 0;

  /// For CUDA graphs: with `enabled`, the fused step reads each param
  /// group's learning rate from a one-element FP32 tensor on the parameters'
  /// device (the fused kernels' tensor-lr form) instead of baking the host
  /// value into the launch, so that a captured step follows schedule changes
  /// once refresh_device_lr() has copied the groups' current values there.
  void set_device_lr(bool enabled);
  /// Whether the fused step reads its learning rates from device tensors
  /// (set_device_lr()); off by default.
  bool device_lr() const { return device_lr_enabled_; }
  /// Copies every param group's current learning rate into its device
  /// tensor: one small fill per group and device, no host sync. Call it
  /// before replaying a captured step.
  virtual void refresh_device_lr() = 0;

  /// One setting that a CUDA graph captured from this optimizer's step bakes
  /// in: a value launched with the kernels rather than read from a tensor.
  struct BakedOption {
    /// Its name in messages, e.g. "momentum" or "betas[0]"; a string literal
    /// (it is kept, not copied).
    const char* name;
    /// Its value; a flag as 0 or 1.
    double value;
    /// Whether it is a flag, shown as false/true.
    bool flag = false;
  };
  /// Receives baked_in_options()' settings one by one.
  using BakedOptionVisitor = c10::function_ref<void(const BakedOption&)>;
  /// Passes to `visit`, in an order that never changes, every option of
  /// param group `group` that a captured step bakes in: all that the step
  /// reads on the host, except the learning rate (read from a device tensor
  /// under device_lr()). lamp::TrainStep compares them before every replay
  /// of its CUDA graphs and captures again when one has changed, naming it
  /// ("param group 0's momentum (0.9 -> 0.5)"); an option left out here
  /// would be replayed with its old value. Pure virtual, so that every
  /// optimizer says what it bakes in; one whose step bakes in nothing visits
  /// nothing. Called before every step: it should allocate nothing.
  ///
  /// Example (an optimizer with a host-side `temperature` of its own):
  /// \code
  ///   void baked_in_options(const torch::optim::OptimizerParamGroup& group,
  ///                         BakedOptionVisitor visit) const override {
  ///     lamp::optim::SGD::baked_in_options(group, visit);
  ///     visit({"temperature", temperature_});
  ///   }
  /// \endcode
  virtual void baked_in_options(const torch::optim::OptimizerParamGroup& group,
                                BakedOptionVisitor visit) const = 0;

  /// Changes whenever load() has replaced the optimizer's state tensors. A
  /// CUDA graph captured before keeps updating the tensors it was captured
  /// with, so lamp::TrainStep captures its step again when this changes.
  uint64_t state_version() const { return state_version_; }

 protected:
  /// For load() overrides: the state tensors were replaced.
  void state_replaced() { ++state_version_; }
  /// The learning-rate tensor of param group `group` on `device`, made from
  /// `lr` the first time; undefined while device_lr() is off.
  torch::Tensor device_lr_for(size_t group, double lr,
                              const torch::Device& device);
  /// refresh_device_lr() for an optimizer whose param groups are `self`'s
  /// (the optimizer itself): what the overrides call. A device tensor of a
  /// param group that no longer exists is a TORCH_CHECK error.
  void refresh_device_lr(const torch::optim::Optimizer& self);

 private:
  bool device_lr_enabled_ = false;
  uint64_t state_version_ = 0;
  std::map<std::pair<size_t, std::string>, torch::Tensor> device_lr_;
};

/// What lamp's SGD, Adam and AdamW share, written once: a torch::optim
/// optimizer `Base` (its options, param groups, state and checkpoint format)
/// whose step runs through an Implementation and takes GradScaler's state on
/// the device (AmpStep). A derived optimizer writes its update
/// (step_scaled()), what a captured step bakes in (baked_in_options()) and,
/// where it keeps state of its own, save() and load(); step(),
/// skips_on_device(), refresh_device_lr() and the implementation accessors
/// come from here.
///
/// Example (the shape of lamp::optim::SGD):
/// \code
///   class MySgd : public lamp::optim::FusedOptimizer<torch::optim::SGD> {
///    public:
///     MySgd(std::vector<torch::Tensor> params,
///           torch::optim::SGDOptions defaults)
///         : FusedOptimizer(lamp::optim::Implementation::kAuto, "MySgd",
///                          std::move(params), std::move(defaults)) {}
///     void step_scaled(const torch::Tensor& grad_scale,
///                      const torch::Tensor& found_inf) override;
///     void baked_in_options(const torch::optim::OptimizerParamGroup& group,
///                           BakedOptionVisitor visit) const override;
///   };
/// \endcode
template <typename Base>
class FusedOptimizer : public Base, public AmpStep {
 public:
  /// One update of every parameter with a gradient, through implementation()
  /// (step_scaled() without a scale or an overflow flag). `closure`, if
  /// given, runs first with grad mode on (as in torch::optim) and its loss is
  /// returned; otherwise returns an undefined tensor.
  torch::Tensor step(
      torch::optim::Optimizer::LossClosure closure = nullptr) override;
  /// Whether implementation() is kFused: the fused kernels take the scale and
  /// the overflow flag on the device.
  bool skips_on_device() const override;
  /// Copies each group's learning rate into the device tensor the fused
  /// kernels read (AmpStep::refresh_device_lr()).
  void refresh_device_lr() override;

  /// The implementation requested at construction.
  Implementation requested_implementation() const { return implementation_; }
  /// What step() runs for the current parameters (kAuto resolved). kFused
  /// where the fused kernels do not apply is a TORCH_CHECK error naming the
  /// optimizer, here and at the first step, not at construction: the
  /// parameters may still move to their device.
  Implementation implementation() const;

 protected:
  /// `Base(base_args...)` (which checks the options); `caller` names the
  /// optimizer in errors ("lamp::optim::SGD").
  template <typename... Args>
  FusedOptimizer(Implementation implementation, const char* caller,
                 Args&&... base_args)
      : Base(std::forward<Args>(base_args)...),
        implementation_(implementation),
        caller_(caller) {}

 private:
  Implementation implementation_;
  const char* caller_;
};

/// An optimizer by name, with its hyper-parameters: what the trainer
/// (TrainerOptions::optimizer), the training programs and lamp_bench
/// configure, built by make_optimizer(). The defaults are the CIFAR-10
/// ResNet recipe (SGD, lr 0.1, Nesterov momentum 0.9, weight decay 5e-4), and
/// they are the only defaults of these hyper-parameters in lamp: the trainer
/// and the programs take theirs from here.
struct OptimizerOptions {
  /// "sgd", "adam" or "adamw" (optimizer_names()).
  TORCH_ARG(std::string, name) = "sgd";
  /// Learning rate (the peak of a schedule); > 0.
  TORCH_ARG(double, lr) = 0.1;
  /// SGD's momentum, >= 0 (Adam and AdamW ignore it: their beta1 plays its
  /// part).
  TORCH_ARG(double, momentum) = 0.9;
  /// Adam's and AdamW's beta1, the decay rate of the running mean of the
  /// gradients, in [0, 1); SGD ignores it. Python's default.
  TORCH_ARG(double, beta1) = 0.9;
  /// Adam's and AdamW's beta2, the decay rate of the running mean of the
  /// squared gradients, in [0, 1); SGD ignores it. Python's default; GPT
  /// recipes lower it (nanoGPT: 0.95 for GPT-2, 0.99 for its character
  /// model).
  TORCH_ARG(double, beta2) = 0.999;
  /// Nesterov momentum for SGD; has no effect while momentum is 0.
  TORCH_ARG(bool, nesterov) = true;
  /// L2 penalty for SGD and Adam, decoupled decay for AdamW; >= 0.
  TORCH_ARG(double, weight_decay) = 5e-4;
  /// "No bias decay": lamp's weight-decay rule, no_decay_names()' with its
  /// defaults (nanoGPT's): the parameters with at most one dimension (biases
  /// and the weights and biases of BatchNorm, LayerNorm, GroupNorm) get no
  /// weight decay, in a second param group; those of 2 or more (Linear, Conv
  /// and Embedding weights) get `weight_decay` (decays_by_shape(), the one
  /// predicate both use). What users of AdamW usually want. Off: one group,
  /// all decayed, as torch::optim.
  TORCH_ARG(bool, no_bias_decay) = false;
  /// How the update runs (fused, foreach or per-tensor kernels).
  TORCH_ARG(Implementation, implementation) = Implementation::kAuto;
};

/// The optimizer names make_optimizer() accepts.
const std::vector<std::string>& optimizer_names();

/// Builds lamp::optim::SGD, Adam or AdamW over `params` from `options` (one
/// param group, or two with no_bias_decay: the decayed parameters first);
/// an unknown name is an error listing the valid ones, and so is an empty
/// parameter list (as in Python), a learning rate that is not positive and finite, a negative momentum or
/// weight decay, or a beta outside [0, 1).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    std::vector<torch::Tensor> params, const OptimizerOptions& options);

// Instantiated once, in src/optim/optimizer.cpp.
extern template class FusedOptimizer<torch::optim::SGD>;
extern template class FusedOptimizer<torch::optim::Adam>;
extern template class FusedOptimizer<torch::optim::AdamW>;

} // namespace optim
} // namespace lamp
