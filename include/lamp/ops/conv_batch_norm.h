#pragma once

/// \file
/// BatchNorm folded into the convolutions around it, as the fastest ResNet
/// training stacks run it (NVIDIA's MLPerf submissions, on cuDNN's graph
/// API): a convolution's epilogue sums its output per channel
/// (channel_statistics()), a small finalize step turns the sums into a
/// per-channel scale and bias (finalize_batch_norm()), and the next
/// convolution applies scale, bias and ReLU to its input as it reads it
/// (scale_bias_relu()), so normalised activations are never written and
/// read back. A block's end applies two of them and the residual in one
/// pass (scale_bias_add_relu()). The backward folds the same way: the data
/// gradient of BatchNorm is an affine map of the output gradient and the
/// convolution's output, dY = A dZ + B Y + C per channel
/// (batch_norm_backward()), which cuDNN fuses with the next data gradient
/// and the ReLU's mask.
///
/// This header is that arithmetic in plain ATen ops, on any device: the
/// reference the GPU's fused graphs are tested against, and the statement of
/// which BatchNorm attaches where. folded_batch_norm() and
/// folded_batch_norm_relu() make it a differentiable op equal to
/// BatchNorm2d (+ ReLU) in training and eval mode, running statistics
/// included (tests/conv_batch_norm_test.cpp: every block shape of ResNet18
/// and ResNet50, forward and backward). The differentiable ops
/// (folded_batch_norm(), folded_conv(), folded_residual_block()) are
/// differentiable once: a backward with create_graph=true refuses; the
/// stock modules give higher-order gradients.
///
/// In a ResNet block (BasicBlock: conv1, bn1, conv2, bn2; Bottleneck adds
/// conv3, bn3; the shortcut a 1x1 convolution and its BatchNorm):
///  - conv_k's epilogue computes bn_k's statistics;
///  - conv_{k+1}'s prologue applies bn_k's scale, bias and ReLU;
///  - the block's last BatchNorm, the shortcut's (or the identity) and the
///    ReLU after the addition are one dual scale-bias-add-ReLU pass, whose
///    output is the next block's input (it is needed twice: by the next
///    convolution and by the next residual, so it is written once).

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lamp {
namespace ops {

/// A convolution output's per-channel sums, as its statistics epilogue
/// computes them.
struct ChannelStatistics {
  torch::Tensor sum;            ///< FP32 [C]: the sum over N, H and W
  torch::Tensor sum_of_squares; ///< FP32 [C]: the sum of squares
  int64_t count = 0;            ///< N H W: the values each sum is over
};

/// The statistics epilogue: per-channel sums of `output` ([N, C, H, W], any
/// floating dtype and memory format), accumulated in FP32. Throws
/// c10::Error on another shape or an empty output.
ChannelStatistics channel_statistics(const torch::Tensor& output);

/// A BatchNorm as a per-channel affine map y -> scale y + bias, with the
/// statistics it normalises by.
struct FoldedBatchNorm {
  torch::Tensor scale;   ///< FP32 [C]: weight / sqrt(var + eps)
  torch::Tensor bias;    ///< FP32 [C]: bias - mean scale
  torch::Tensor mean;    ///< FP32 [C]: the mean normalised by
  torch::Tensor inv_std; ///< FP32 [C]: 1 / sqrt(var + eps)
};

/// The finalize step of training: the batch's mean and biased variance from
/// `stats` (var = E[y^2] - E[y]^2, clamped at 0), folded with `weight` and
/// `bias` (FP32 [C], or undefined for an affine-less BatchNorm: 1 and 0).
/// Updates `running_mean` and `running_var` in place as BatchNorm2d does,
/// (1 - momentum) running + momentum batch, the variance unbiased (times
/// count / (count - 1)), where they are defined. The fold is differentiable
/// in the sums, weight and bias (the running statistics' update is not).
/// Throws c10::Error when count < 2 (BatchNorm's own refusal of one value
/// per channel).
FoldedBatchNorm finalize_batch_norm(const ChannelStatistics& stats,
                                    const torch::Tensor& weight,
                                    const torch::Tensor& bias,
                                    const torch::Tensor& running_mean,
                                    const torch::Tensor& running_var,
                                    double momentum, double eps);

/// Eval mode's fold: the running statistics instead of the batch's.
FoldedBatchNorm fold_running_batch_norm(const torch::Tensor& weight,
                                        const torch::Tensor& bias,
                                        const torch::Tensor& running_mean,
                                        const torch::Tensor& running_var,
                                        double eps);

/// The prologue: relu(scale y + bias) per channel of `y` [N, C, H, W],
/// computed in FP32 and returned in y's dtype. Not differentiable by
/// itself (see folded_batch_norm_relu()).
torch::Tensor scale_bias_relu(const torch::Tensor& y,
                              const FoldedBatchNorm& folded);

/// The dual pass at a block's end: relu(scale y + bias + residual), the
/// residual being the identity (the block's input) or the shortcut's own
/// scale_b y_b + bias_b; in FP32, returned in y's dtype.
torch::Tensor scale_bias_add_relu(const torch::Tensor& y,
                                  const FoldedBatchNorm& folded,
                                  const torch::Tensor& residual);

/// BatchNorm's backward in training, folded: from the convolution's output
/// `y`, the gradient `grad_z` reaching BatchNorm's output (after the ReLU's
/// mask) and the fold of the forward, the weight and bias gradients and the
/// per-channel A, B, C of dY = A dZ + B Y + C, over M = N H W values:
///   d_bias = sum dZ,  d_weight = inv_std (sum dZ Y - mean sum dZ),
///   A = scale,  B = -scale inv_std d_weight / M,
///   C = -scale d_bias / M - B mean.
/// All FP32 [C].
struct BatchNormBackward {
  torch::Tensor grad_weight; ///< dL/dweight
  torch::Tensor grad_bias;   ///< dL/dbias
  torch::Tensor a;           ///< dY's coefficient of dZ
  torch::Tensor b;           ///< dY's coefficient of Y
  torch::Tensor c;           ///< dY's constant
};

/// See BatchNormBackward.
BatchNormBackward batch_norm_backward(const torch::Tensor& y,
                                      const torch::Tensor& grad_z,
                                      const FoldedBatchNorm& folded);

/// dY = A dZ + B Y + C per channel, in y's dtype.
torch::Tensor apply_batch_norm_backward(const torch::Tensor& y,
                                        const torch::Tensor& grad_z,
                                        const BatchNormBackward& backward);

/// `bn->forward(y)` through the folded arithmetic: in training the batch's
/// statistics (channel_statistics(), finalize_batch_norm(), running
/// statistics and num_batches_tracked updated as bn->forward() does), in
/// eval the running ones; differentiable in y and bn's weight and bias,
/// the backward by batch_norm_backward() (eval: dY = scale dZ).
torch::Tensor folded_batch_norm(const torch::Tensor& y,
                                const torch::nn::BatchNorm2d& bn);

/// `torch::relu(bn->forward(y))` through the folded arithmetic.
torch::Tensor folded_batch_norm_relu(const torch::Tensor& y,
                                     const torch::nn::BatchNorm2d& bn);

/// `torch::relu(bn->forward(y) + residual)` through the folded arithmetic.
torch::Tensor folded_batch_norm_add_relu(const torch::Tensor& y,
                                         const torch::Tensor& residual,
                                         const torch::nn::BatchNorm2d& bn);

/// One convolution of a folded chain, with its statistics epilogue: what
/// folded_conv() returns.
struct FoldedConv {
  torch::Tensor output;         ///< conv(prologue(x)), x's dtype and layout
  torch::Tensor sum;            ///< FP32 [C_out]: output's sum per channel
  torch::Tensor sum_of_squares; ///< FP32 [C_out]: the sum of its squares
};

/// How folded_conv() and folded_residual_block() compute.
enum class FoldedBackend {
  /// cuDNN's fused graphs where they apply (a CUDA lamp built with
  /// cudnn-frontend, CUDA tensors in half or bfloat16, channels_last), the
  /// ATen reference everywhere else and for any layer whose graph cuDNN
  /// refuses (one line on stderr names the layer and cuDNN's reason).
  kAuto,
  /// Always the ATen reference: the arithmetic the graphs are tested
  /// against.
  kReference,
};

/// conv(relu(scale x + bias)) (the prologue, when `in_scale` and `in_bias`
/// are defined: x is the previous convolution's raw output and scale, bias
/// the fold of its BatchNorm) or conv(x), with the output's per-channel sums
/// (the statistics epilogue). One cuDNN graph each way on the GPU: forward
/// prologue + convolution + statistics, backward the data gradient with
/// the ReLU's mask and the sums that give `in_scale`'s and `in_bias`'s
/// gradients, and the weight gradient with the prologue recomputed.
///
/// Differentiable in x, weight, in_scale and in_bias, with gradients flowing
/// in through all three outputs (a statistic's gradient adds
/// d_sum + 2 d_sum_of_squares y to the output's). `weight` is
/// [C_out, C_in, kH, kW] and is used in x's dtype (autocast, where it is
/// on, casts neither: an FP32 x convolves in FP32); `stride` and `padding`
/// apply to both spatial dimensions; no bias, groups or dilation. `name`
/// labels the layer in the fallback line. Throws c10::Error on shapes that
/// do not fit.
FoldedConv folded_conv(const torch::Tensor& x, const torch::Tensor& weight,
                       int64_t stride, int64_t padding,
                       const torch::Tensor& in_scale,
                       const torch::Tensor& in_bias,
                       const std::string& name = "conv",
                       FoldedBackend backend = FoldedBackend::kAuto);

/// The finalize step as a differentiable op for training: the fold of
/// `bn` from a convolution's sums over `count` values per channel (its
/// scale and bias depend on the sums and on bn's weight and bias, so
/// gradients reach all four), updating bn's running statistics and
/// num_batches_tracked exactly as bn->forward() does in training. In eval
/// mode, the running statistics' fold (the sums are not used). Requires an
/// affine BatchNorm.
FoldedBatchNorm finalize_batch_norm(const torch::Tensor& sum,
                                    const torch::Tensor& sum_of_squares,
                                    int64_t count,
                                    const torch::nn::BatchNorm2d& bn);

/// A convolution and the BatchNorm of its output, in a residual block.
struct ConvBatchNormLayer {
  torch::nn::Conv2d conv{nullptr};    ///< no bias, groups 1, dilation 1
  torch::nn::BatchNorm2d bn{nullptr}; ///< affine
  std::string name;                   ///< e.g. "layer2.0.conv1", for messages
};

/// A ResNet block with every BatchNorm folded into the convolutions:
/// `relu(bn_n(conv_n(... relu(bn_1(conv_1(x))) ...)) + shortcut(x))`, the
/// shortcut being `bn_s(conv_s(x))` when `shortcut` is given and the
/// identity otherwise. conv_1 and conv_s read x as it is (a previous
/// block's output, already through its ReLU); each later convolution
/// applies the previous BatchNorm and ReLU in its prologue (folded_conv());
/// the last BatchNorm, the shortcut's and the ReLU after the addition are
/// one pass. Equal to the stock modules' forward and backward in training
/// and eval mode, running statistics included (tests/conv_batch_norm_test.cpp
/// for every block shape of ResNet18 and ResNet50).
torch::Tensor folded_residual_block(
    const torch::Tensor& x, const std::vector<ConvBatchNormLayer>& chain,
    const ConvBatchNormLayer* shortcut = nullptr,
    FoldedBackend backend = FoldedBackend::kAuto);

/// "" when folded_conv() runs cuDNN's graphs for `x` (subject to cuDNN
/// accepting each shape); otherwise why it runs the ATen reference (a lamp
/// built without cudnn-frontend or CUDA, a CPU tensor, FP32, not
/// channels_last).
std::string folded_conv_fallback_reason(const torch::Tensor& x);

/// True when this lamp was built with cuDNN's graphs for folded_conv() (a
/// CUDA LibTorch and cudnn-frontend's headers at configure time, and the
/// loaded cuDNN offers the graph API); otherwise false with the reason in
/// `why` when given.
bool conv_batch_norm_fusion_built(std::string* why = nullptr);

/// The layers that fell back to the reference since the process started,
/// one "name (pass): reason" line each (cuDNN's reason for a graph, or why
/// lamp's elementwise kernel did not take a step's tensors): what the
/// fallback lines printed.
std::vector<std::string> folded_conv_fallbacks();

} // namespace ops
} // namespace lamp
