#pragma once

/// \file
/// A residual add and the LayerNorm or RMSNorm that follows it, in one
/// operation: `s = x + branch; y = norm(s)`, the pair a pre-norm
/// transformer computes between its blocks. On CUDA, where lamp was built
/// with its CUDA kernels, one kernel reads x and the branch once and writes
/// s and y, and one kernel computes every gradient (llm.c's fused residual
/// and LayerNorm); elsewhere the same arithmetic runs as ATen ops.

#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/types.h>

#include <string>
#include <utility>

namespace lamp {
namespace ops {

/// Options of add_layer_norm() and add_rms_norm().
struct AddNormOptions {
  /// Added to the variance (LayerNorm) or the mean square (RMSNorm); must be
  /// positive. 1e-5: LayerNorm's default, and lamp's GPT's for both norms.
  TORCH_ARG(double, eps) = 1e-5;
  /// The dtype of the normalised output. Unset: what the unfused norm
  /// returns: under autocast, FP32 for a LayerNorm of a 16-bit or FP32 sum
  /// on CUDA (autocast's FP32 list) and on the CPU with LibTorch 1.13
  /// (lamp's FP32 kernel), the sum's dtype on the CPU with 2.x (its
  /// mixed-dtype kernels); else the sum's dtype, FP64 always. A GPT sets autocast's dtype here where
  /// the next op is a linear that would cast to it anyway: the same bits,
  /// one pass over memory less.
  TORCH_ARG(c10::optional<at::ScalarType>, output_dtype) = c10::nullopt;
};

/// The sum and its normalisation: `{x + branch, norm(x + branch)}`.
struct AddNormResult {
  /// x + branch, in the dtype the two promote to (FP32 for an FP32 residual
  /// stream and a 16-bit branch).
  torch::Tensor sum;
  /// The normalised sum, in AddNormOptions::output_dtype.
  torch::Tensor normed;
};

/// `s = x + branch`, `y = layer_norm(s, [width], weight, bias, eps)` over
/// the last dimension, in one pass each way on CUDA (see the file's
/// comment).
///
/// - `x`, `branch`: floating point, the same shape [..., width] (width the
///   last dimension), on one device. `weight`, `bias`: [width], either may
///   be undefined (ones, zeros), FP32 or the inputs' dtype.
/// - The statistics, the normalisation and every gradient are computed in
///   FP32 whatever the inputs' dtypes; s is rounded to its dtype before it
///   is normalised, as the unfused ops do.
/// - Differentiable in x, branch, weight and bias; the gradient of s from
///   its later uses (the residual stream going on) and the gradient of y
///   are both taken. The gradients of x and branch are equal (in their
///   own dtypes).
///
/// Compared with add_layer_norm_reference(): FP32 agrees to FP32 rounding
/// (another order of the row's sums); a 16-bit output may differ by one
/// unit in the last place where FP32 values round either way.
///
/// Throws c10::Error, naming the argument and the fix, on shapes that do
/// not match, no rows, tensors that are not floating point, tensors on
/// different devices, or an eps that is not positive.
///
/// Example (a pre-norm block's second half, as models::GPT computes it
/// with GPTOptions::fused_add_norm):
/// \code
///   auto [x1, normed] = lamp::ops::add_layer_norm(x, attn(ln_1(x)),
///                                                 ln_2->weight, ln_2->bias);
///   auto out = x1 + mlp(normed);
/// \endcode
///
/// \warning Differentiable once: a backward with create_graph=true stops
/// with an error naming the reference, which gives second derivatives.
AddNormResult add_layer_norm(const torch::Tensor& x,
                             const torch::Tensor& branch,
                             const torch::Tensor& weight,
                             const torch::Tensor& bias,
                             const AddNormOptions& options = {});

/// `s = x + branch`, `y = s / sqrt(mean(s^2) + eps) * weight` over the last
/// dimension (lamp::nn::rms_norm's formula), as add_layer_norm() computes
/// its pair; the same arguments, less the bias.
AddNormResult add_rms_norm(const torch::Tensor& x, const torch::Tensor& branch,
                           const torch::Tensor& weight,
                           const AddNormOptions& options = {});

/// The composition add_layer_norm() replaces, in stock ops: `x + branch`,
/// then torch::layer_norm on the sum in FP32 (as autocast runs it; FP64
/// stays FP64), the output cast to AddNormOptions::output_dtype (unset: as
/// add_layer_norm() chooses). Its tests' reference.
AddNormResult add_layer_norm_reference(const torch::Tensor& x,
                                       const torch::Tensor& branch,
                                       const torch::Tensor& weight,
                                       const torch::Tensor& bias,
                                       const AddNormOptions& options = {});

/// The composition add_rms_norm() replaces: `x + branch`, then
/// lamp::nn::rms_norm's arithmetic (in FP32, the output cast as above).
AddNormResult add_rms_norm_reference(const torch::Tensor& x,
                                     const torch::Tensor& branch,
                                     const torch::Tensor& weight,
                                     const AddNormOptions& options = {});

/// Which code add_layer_norm() and add_rms_norm() run for inputs like these:
/// "lamp's CUDA kernel", or "ATen ops" followed by why (not a CUDA tensor;
/// lamp built without its CUDA kernels; a dtype the kernel does not take).
/// A CUDA tensor the kernel cannot take runs the ATen ops, with this reason
/// given once as a warning.
std::string add_norm_path(const torch::Tensor& x, const torch::Tensor& branch);

} // namespace ops
} // namespace lamp
