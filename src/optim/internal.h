#pragma once

// What lamp's optimizers share: choosing the implementation, grouping
// parameters for the multi-tensor kernels, and the fallback for a scaled
// step on the paths without on-device skipping.

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lamp/optim/optimizer.h"

namespace lamp {
namespace optim {
namespace internal {

/// The parameters of one param group that have gradients, grouped by
/// (device, dtype): the fused and foreach kernels take one such group per
/// call.
struct Bucket {
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> grads;
};
std::map<std::pair<std::string, torch::ScalarType>, Bucket> buckets(
    torch::optim::OptimizerParamGroup& group, const char* caller);

/// Whether the fused kernels apply to every parameter of `optimizer` that
/// has a gradient (or, before the first backward, every parameter).
bool fused_applies(const torch::optim::Optimizer& optimizer);

/// kAuto resolved for `optimizer`'s current parameters; kFused where it does
/// not apply is an error naming `caller`.
Implementation resolve(Implementation requested,
                       const torch::optim::Optimizer& optimizer,
                       const char* caller);

/// `found_inf` as the fused kernels need it: exactly 1 where it is non-zero.
/// ATen's fused SGD/Adam skip only on found_inf == 1, and lamp's Adam
/// subtracts the flag from its step counts; a flag summed over ranks or
/// accumulation cycles (2, 3, ...) or averaged (0.5) would step on garbage.
/// A negative or NaN flag skips too, as on the other paths. No host read;
/// undefined stays undefined.
torch::Tensor skip_flag(const torch::Tensor& found_inf);

/// Refuses to make optimizer state for `p` while a CUDA graph is being
/// captured on its device: state made inside the capture would be made
/// again (zero-filled, or with the step count of the capture) by every
/// replay. A TORCH_CHECK error naming `caller` and the fix.
void check_not_capturing(const torch::Tensor& p, const char* caller);

/// For the paths that cannot skip on the device: reads `found_inf` (a host
/// sync on CUDA) and, when it is zero, divides the gradients by
/// `grad_scale` (if defined). Returns whether the step should run.
bool prepare_scaled_step(torch::optim::Optimizer& optimizer,
                         const torch::Tensor& grad_scale,
                         const torch::Tensor& found_inf);

/// `groups` with each parameter once: a tensor listed twice in a group (a
/// tied weight in `model->parameters()`) is kept at its first position; one
/// in two groups is an error naming `caller`, as in Python.
std::vector<torch::optim::OptimizerParamGroup> unique_param_groups(
    std::vector<torch::optim::OptimizerParamGroup> groups, const char* caller);

/// Adds `groups` to `optimizer` (built with no groups) after
/// unique_param_groups, each group keeping the options it was given, exactly:
/// LibTorch 2.15's add_param_group replaces every option of a group that
/// equals the options class's constructor default by the optimizer's default
/// (PyTorch issue 141884), so an explicit weight_decay(0) on a no-decay group
/// would silently become the optimizer's weight decay. A group without
/// options takes the optimizer's defaults, as on every version.
void add_param_groups_as_given(
    torch::optim::Optimizer& optimizer,
    std::vector<torch::optim::OptimizerParamGroup> groups, const char* caller);

/// Refuses `optimizer`'s param groups whose options are another optimizer's
/// (SGDOptions in an Adam: the step would read them as its own, undefined
/// behaviour) or hold values it cannot step with: lr, eps, weight_decay,
/// momentum and dampening negative or not finite, a beta outside [0, 1),
/// Nesterov without momentum or with dampening. LibTorch checks only the
/// defaults, and only their signs. A TORCH_CHECK error naming `caller`, the
/// group, the value and the fix. At construction and at every step: a
/// group may be added (add_param_group) or changed (options()) between.
void check_param_groups(const torch::optim::SGD& optimizer, const char* caller);
void check_param_groups(const torch::optim::Adam& optimizer,
                        const char* caller);
void check_param_groups(const torch::optim::AdamW& optimizer,
                        const char* caller);

/// `load(archive)` (the base class's load) with the state replaced, not
/// merged: LibTorch's load writes the states the archive holds and keeps
/// every other, so a parameter absent from the checkpoint kept its old
/// momentum or moments beside lamp's fresh bookkeeping (its step count,
/// its first-step flags). After it the state is the checkpoint's, as after
/// Python's load_state_dict; a load that throws puts the old state back.
template <typename Load>
void load_replacing_state(torch::optim::Optimizer& optimizer, Load&& load) {
  auto previous = std::move(optimizer.state());
  optimizer.state().clear();
  try {
    load();
  } catch (...) {
    optimizer.state() = std::move(previous);
    throw;
  }
}

/// Runs `closure` with grad mode on, as torch::optim's step does.
torch::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure);

} // namespace internal
} // namespace optim
} // namespace lamp
