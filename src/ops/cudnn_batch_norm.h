#pragma once

// cuDNN's fused BatchNorm + activation (+ add) training kernels
// (cudnnBatchNormalizationForwardTrainingEx / BackwardEx), for
// lamp::ops::batch_norm_relu. Implemented in src/ops/cudnn_batch_norm.cpp
// when lamp is built against a CUDA LibTorch and cuDNN's headers were found;
// src/ops/cudnn_batch_norm_none.cpp otherwise (refuses, with why).
//
// cuDNN's symbols are resolved at run time from the libcudnn that LibTorch
// itself loaded, so lamp neither links cuDNN nor needs to find its library.

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace lamp {
namespace detail {

/// How to turn the fusion off, for the fused path's errors: the programs' flag
/// and the ResNets' option (the example.cli.message_flags test runs the
/// programs with every flag that a message in src/ names).
constexpr const char* kFusionOffAdvice =
    "--fused-bn off in lamp's programs and lamp_bench, ResNetOptions::fused_batch_norm(false) for lamp's ResNets, or the stock ops in your own network";

/// What the fused forward produces and its backward needs.
struct FusedBatchNormForward {
  torch::Tensor output;      // relu(bn(x) [+ z]), x's dtype and layout
  torch::Tensor save_mean;   // batch mean, float [C]
  torch::Tensor save_invstd; // batch 1 / sqrt(var + eps), float [C]
  torch::Tensor reserve;     // cuDNN's reserve space (bytes), for backward
  // The bytes of `reserve` cuDNN asked for (reserve has at least one).
  int64_t reserve_size = 0;
};

/// Gradients of the fused op's inputs.
struct FusedBatchNormBackward {
  torch::Tensor input, residual, weight, bias;
};

/// "" when cuDNN's fused kernels can be tried in this build and process;
/// otherwise why not (no cuDNN headers at build time, a LibTorch without
/// CUDA, libcudnn not loaded or lacking the functions).
std::string cudnn_batch_norm_unavailable_reason();

/// relu(batch_norm(x) + z) (z undefined: relu(batch_norm(x))) in training
/// mode, updating running_mean/running_var (when defined) with `factor`.
/// x (and z): CUDA, 4-D, half or bfloat16, channels_last-contiguous;
/// weight, bias, running stats: float, contiguous, C elements. Returns false
/// (and sets `why`) when cuDNN reports the configuration unsupported, before
/// anything was written; other cuDNN errors throw.
bool cudnn_batch_norm_activation_forward(
    const torch::Tensor& x, const torch::Tensor& z, const torch::Tensor& weight,
    const torch::Tensor& bias, const torch::Tensor& running_mean,
    const torch::Tensor& running_var, double factor, double eps,
    FusedBatchNormForward& result, std::string& why);

/// The backward of the forward above for `grad_output` (made
/// channels_last-contiguous here): gradients of x, z (when `has_residual`),
/// weight and bias.
FusedBatchNormBackward cudnn_batch_norm_activation_backward(
    const torch::Tensor& grad_output, const torch::Tensor& x, bool has_residual,
    const torch::Tensor& weight, const torch::Tensor& bias,
    const FusedBatchNormForward& saved, double eps);

} // namespace detail
} // namespace lamp
