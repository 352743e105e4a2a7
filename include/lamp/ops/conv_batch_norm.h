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
/// and ResNet50, forward and backward).
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
#include <torch/types.h>

#include <cstdint>

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
/// count / (count - 1)), where they are defined. Throws c10::Error when
/// count < 2 (BatchNorm's own refusal of one value per channel).
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

} // namespace ops
} // namespace lamp
