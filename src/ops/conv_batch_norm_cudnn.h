#pragma once

// cuDNN's graph-API patterns behind lamp::ops::folded_conv(), through
// cudnn-frontend: src/ops/conv_batch_norm_cudnn.cpp when lamp is built
// against a CUDA LibTorch with cudnn-frontend's headers found at configure
// time, src/ops/conv_batch_norm_cudnn_none.cpp otherwise (refuses, with
// why). Each function builds its graph once per shape and dtype (the plan
// cache), runs it on ATen's cuDNN handle and current stream with a workspace
// from ATen's allocator, so CUDA graphs capture it like ATen's own
// convolutions. Each returns false and sets `why` when cuDNN refuses the
// graph for the shape (before anything was written) or fails to run it
// (refused from then on); the caller then runs the ATen reference for that
// layer, into outputs of its own. Under torch.backends.cudnn.deterministic
// or use_deterministic_algorithms only engines without cuDNN's
// NONDETERMINISTIC note are taken.
//
// Tensors: x, y, dy NHWC (channels_last-contiguous), half or bfloat16, on
// one CUDA device; weight [K, C, R, S] channels_last in x's dtype; scale and
// bias FP32 [C] contiguous; sums FP32 [K].

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lamp {
namespace detail {

/// "" when the graphs can be tried in this build and process; otherwise why
/// not (no cudnn-frontend at build time, no CUDA, libcudnn not loaded, a
/// cuDNN older than the patterns need).
std::string cudnn_graph_unavailable_reason();

/// The graphs this process built or was refused, a line each, sorted:
/// "forward cuda:0 Half x 32x64x16x16 w 128x64x3x3 stride 1 padding 1,
/// prologue: plan <cuDNN's engine and knobs>, scale and bias in FP32,
/// workspace N bytes", or the key and why cuDNN refused it (or why it failed
/// to run). Empty where the graphs are not built.
std::vector<std::string> cudnn_graph_descriptions();

/// y = conv(relu(scale x + bias)) (prologue when scale is defined) or
/// conv(x), and y's per-channel sum and sum of squares (genstats).
bool cudnn_conv_genstats(const torch::Tensor& x, const torch::Tensor& weight,
                         int64_t stride, int64_t padding,
                         const torch::Tensor& scale, const torch::Tensor& bias,
                         torch::Tensor& y, torch::Tensor& sum,
                         torch::Tensor& sum_of_squares, std::string& why);

/// The data gradient through the prologue: dz = dgrad(dy, weight) masked by
/// relu's (scale x + bias > 0), in x's dtype, with d_scale = sum(dz x) and
/// d_bias = sum(dz) per channel (dbn_weight with mean 0, inverse variance 1).
bool cudnn_dgrad_drelu_dscale(const torch::Tensor& dy,
                              const torch::Tensor& weight,
                              const torch::Tensor& x, int64_t stride,
                              int64_t padding, const torch::Tensor& scale,
                              const torch::Tensor& bias, torch::Tensor& dz,
                              torch::Tensor& d_scale, torch::Tensor& d_bias,
                              std::string& why);

/// The weight gradient with the prologue recomputed:
/// dw = wgrad(dy, relu(scale x + bias)), in x's dtype.
bool cudnn_wgrad_prologue(const torch::Tensor& dy, const torch::Tensor& x,
                          const torch::Tensor& weight, int64_t stride,
                          int64_t padding, const torch::Tensor& scale,
                          const torch::Tensor& bias, torch::Tensor& dw,
                          std::string& why);

} // namespace detail
} // namespace lamp
