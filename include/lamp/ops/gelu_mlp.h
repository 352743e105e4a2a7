#pragma once

/// \file
/// A transformer's MLP, `proj(gelu(fc(x)))`, as one operation whose bias
/// and GELU run in the matrix products' epilogues. On CUDA, where lamp was
/// built with its CUDA kernels, the first product adds its bias, applies
/// the GELU and keeps the pre-activation in one cuBLASLt call (epilogue
/// GELU_AUX_BIAS); in the backward the product that gives the gradient of
/// the GELU's output applies the GELU's derivative and sums the first
/// bias's gradient as it writes (epilogue DGELU_BGRAD): llm.c's and Apex's
/// fused MLP. The GELU pass over the 4-times-wide activation and its
/// backward pass are gone. Elsewhere the same products run as ATen ops.

#include <torch/arg.h>
#include <torch/types.h>

#include <string>

namespace lamp {
namespace ops {

/// Options of gelu_mlp().
struct GeluMlpOptions {
  /// The GELU, as torch::nn::functional::gelu names it: "none" (erf, the
  /// default there and here) or "tanh" (GPT-2's approximation). cuBLASLt's
  /// epilogue computes the tanh form: only "tanh" runs fused on CUDA.
  TORCH_ARG(std::string, approximate) = "none";
  /// Where the epilogues run, the second bias's gradient is summed in the
  /// second layer's weight-gradient product too (epilogue BGRADB, as
  /// lamp::ops::linear_bgrad() does), instead of by a reduction of its own.
  /// Off by default until a GPU run has measured it.
  TORCH_ARG(bool, fused_bias_grad) = false;
};

/// `proj_weight`/`proj_bias` applied to the GELU of `fc_weight`/`fc_bias`
/// applied to x: `linear(gelu(linear(x, fc_weight, fc_bias)), proj_weight,
/// proj_bias)` over x's last dimension ([..., in] -> [..., out]), in one
/// operation (see the file's comment).
///
/// - `x`: floating point [..., in] with at least one row. `fc_weight`
///   [hidden, in], `proj_weight` [out, hidden]; the biases [hidden] and
///   [out], either may be undefined. All on x's device.
/// - The products run in autocast's dtype where autocast is on for the
///   device (as autocast runs linear), else in x's dtype (the weights cast
///   to it). The output has that dtype; the gradients come in each input's
///   own dtype.
/// - Off the fused path, the arithmetic is the unfused composition's, op
///   for op (gelu_mlp_reference()): the same bits on the CPU. The fused
///   path rounds the pre-activation once instead of twice and applies the
///   GELU and its derivative to the FP32 accumulator: each output within a
///   unit or two in the last place of the 16-bit composition.
///
/// Throws c10::Error, naming the argument and the fix, on shapes that do
/// not fit, no rows, tensors that are not floating point, tensors on other
/// devices than x, or an unknown `approximate`.
///
/// Example (lamp's GPT with GPTOptions::fused_mlp):
/// \code
///   auto y = lamp::ops::gelu_mlp(
///       normed, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias,
///       lamp::ops::GeluMlpOptions().approximate("tanh"));
/// \endcode
///
/// \warning Differentiable once: a backward with create_graph=true stops
/// with an error naming gelu_mlp_reference(), which gives second
/// derivatives.
torch::Tensor gelu_mlp(const torch::Tensor& x, const torch::Tensor& fc_weight,
                       const torch::Tensor& fc_bias,
                       const torch::Tensor& proj_weight,
                       const torch::Tensor& proj_bias,
                       const GeluMlpOptions& options = {});

/// The composition gelu_mlp() replaces, in stock ops: torch::linear,
/// torch::gelu, torch::linear (autocast casts as it does for them; without
/// autocast the weights are cast to x's dtype). Its tests' reference.
torch::Tensor gelu_mlp_reference(const torch::Tensor& x,
                                 const torch::Tensor& fc_weight,
                                 const torch::Tensor& fc_bias,
                                 const torch::Tensor& proj_weight,
                                 const torch::Tensor& proj_bias,
                                 const GeluMlpOptions& options = {});

/// Which code gelu_mlp() runs for these arguments: "cuBLASLt epilogues",
/// or "ATen ops" followed by why (not a CUDA tensor; lamp built without its
/// CUDA kernels; the exact GELU; a dtype, size or alignment the epilogues
/// do not take). On CUDA, gelu_mlp() gives that reason once as a warning
/// and runs the ATen ops; so it does where cuBLASLt finds no algorithm.
std::string gelu_mlp_path(const torch::Tensor& x,
                          const torch::Tensor& fc_weight,
                          const torch::Tensor& proj_weight,
                          const GeluMlpOptions& options = {});

} // namespace ops
} // namespace lamp
