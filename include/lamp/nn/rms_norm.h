#pragma once

/// \file
/// lamp::nn::RMSNorm: root-mean-square layer normalisation (LibTorch's C++
/// API has none), with Python's torch.nn.RMSNorm parameter name (`weight`),
/// so that state dicts pass between the two.

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <ostream>
#include <vector>

namespace lamp {
namespace nn {

/// Options of lamp::nn::RMSNorm, as Python's torch.nn.RMSNorm takes them.
struct RMSNormOptions {
  /// Normalises over the last `normalized_shape.size()` dimensions, whose
  /// sizes must be these.
  /* implicit */ RMSNormOptions(std::vector<int64_t> normalized_shape);
  /// The trailing shape normalised over (and the weight's shape).
  TORCH_ARG(std::vector<int64_t>, normalized_shape);
  /// Added to the mean square; unset: the machine epsilon of the dtype it
  /// computes in (FP32's 2^-23 for FP32, FP16 and BF16 inputs, FP64's for
  /// FP64), as Python's torch.nn.RMSNorm since PyTorch 2.7. Finite and
  /// >= 0 (else rms_norm() throws).
  TORCH_ARG(c10::optional<double>, eps) = c10::nullopt;
  /// A learnable per-element scale `weight`, initialised to ones.
  TORCH_ARG(bool, elementwise_affine) = true;
};

/// y = x / sqrt(mean(x^2) + eps) * weight, the mean over the trailing
/// `normalized_shape`. Computed in FP32 whatever the input's dtype (as
/// autocast's FP32 list treats the other norms), and returned in the input's
/// dtype; `weight` may be FP32 beside a 16-bit input. `eps` unset: the
/// machine epsilon of the dtype it computes in (RMSNormOptions::eps).
/// Errors name a trailing shape that does not match.
torch::Tensor rms_norm(const torch::Tensor& input,
                       const std::vector<int64_t>& normalized_shape,
                       const torch::Tensor& weight = {},
                       c10::optional<double> eps = c10::nullopt);

/// The module of rms_norm(); `weight` is its only parameter.
///
/// Example:
/// \code
///   lamp::nn::RMSNorm norm(std::vector<int64_t>{384});
///   auto y = norm(x);  // x: [batch, time, 384]
/// \endcode
class RMSNormImpl : public torch::nn::Cloneable<RMSNormImpl> {
 public:
  /// Normalises over the trailing `normalized_shape`.
  explicit RMSNormImpl(std::vector<int64_t> normalized_shape)
      : RMSNormImpl(RMSNormOptions(std::move(normalized_shape))) {}
  /// With all options.
  explicit RMSNormImpl(RMSNormOptions options);

  /// Registers `weight` (ones) when elementwise_affine.
  void reset() override;
  /// Sets `weight` to ones.
  void reset_parameters();
  /// "lamp::nn::RMSNorm([384], eps=None, elementwise_affine=true)".
  void pretty_print(std::ostream& stream) const override;
  /// rms_norm(input, options.normalized_shape(), weight, options.eps()).
  torch::Tensor forward(const torch::Tensor& input);

  /// The options it was built with.
  RMSNormOptions options;
  /// The per-element scale (undefined without elementwise_affine).
  torch::Tensor weight;
};

/// A ModuleHolder of RMSNormImpl (see torch::nn::ModuleHolder).
TORCH_MODULE(RMSNorm);

} // namespace nn
} // namespace lamp
