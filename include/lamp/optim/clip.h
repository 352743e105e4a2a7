#pragma once

/// \file
/// Gradient clipping that never waits for the device.

#include <torch/types.h>

#include <functional>
#include <vector>

namespace lamp {
namespace optim {

/// Scales the gradients of `params` in place so that their global L2 norm is
/// at most `max_norm` (torch::nn::utils::clip_grad_norm_'s rule: coefficient
/// max_norm / (norm + 1e-6), clamped to 1), and returns the norm before
/// clipping as a 0-dim tensor on the first gradient's device. Unlike
/// LibTorch's clip_grad_norm_, which returns a double and so waits for the
/// GPU, nothing here reads a value on the host: the norms are multi-tensor
/// kernels (`at::_foreach_norm`), the coefficient stays on the device.
/// Parameters without a gradient are ignored; an inf/NaN gradient gives a
/// non-finite norm and non-finite gradients (GradScaler then skips the step).
/// `max_norm` must be positive; infinity only measures the norm, as in
/// Python.
///
/// Example:
/// \code
///   scaler.unscale_(optimizer);
///   lamp::optim::clip_grad_norm_(model->parameters(), 1.0);
///   scaler.step(optimizer);
/// \endcode
torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& params,
                              double max_norm);

/// clip_grad_norm_() for parameters sharded among ranks (each rank holds
/// part of every gradient, as with ZeRO): `reduce_square_sum` replaces this
/// rank's sum of squared gradient elements (a one-element FP32 tensor on
/// the first gradient's device; 0, on the first parameter's device, when
/// the rank holds no gradient) in
/// place by its sum over the ranks, so every rank clips with the global
/// norm and returns it. Also with no gradient at all: every rank must call
/// the reduction the same number of times. A null `reduce_square_sum` is
/// clip_grad_norm_(params, max_norm).
torch::Tensor clip_grad_norm_(
    const std::vector<torch::Tensor>& params, double max_norm,
    const std::function<void(torch::Tensor&)>& reduce_square_sum);

} // namespace optim
} // namespace lamp
