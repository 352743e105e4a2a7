#pragma once

/// \file
/// CIFAR-style ResNets (He et al., 2016, "Deep Residual Learning for Image
/// Recognition"), as used by kuangliu/pytorch-cifar and by the
/// kentaroy47/pytorch-cifar10-fp16 seed, with kuangliu's module names so that
/// state-dict keys match theirs ("layer2.0.shortcut.0.weight", "linear.bias").

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "lamp/ops/conv_batch_norm.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lamp {
namespace models {

/// The residual block of ResNet18/34: two 3x3 convolutions (no bias), each
/// followed by BatchNorm, with a ReLU after the first and after the residual
/// addition. Output has `planes * kExpansion` channels.
///
/// Children: "conv1", "bn1", "conv2", "bn2", and, when the stride is not 1 or
/// the channel count changes, "shortcut": a Sequential of a 1x1 convolution
/// (stride `stride`, no bias) and a BatchNorm ("shortcut.0", "shortcut.1").
/// Otherwise the shortcut is the identity and is not registered.
class BasicBlockImpl : public torch::nn::Module {
 public:
  /// Output channels per plane: the block outputs `planes` channels.
  static constexpr int64_t kExpansion = 1;

  /// A block from `in_planes` input channels to `planes` output channels;
  /// `stride` 2 halves the height and width (rounding up), in conv1 and in
  /// the shortcut. `fused_batch_norm`: each BatchNorm and the ReLU (and the
  /// residual addition) after it run as one op where they can
  /// (lamp::ops::batch_norm_relu), the stock ops elsewhere.
  /// `fold_batch_norm`: in training, on the GPU, every BatchNorm folded
  /// into the convolutions around it (lamp::ops::folded_residual_block;
  /// ResNetOptions::fold_batch_norm).
  BasicBlockImpl(int64_t in_planes, int64_t planes, int64_t stride = 1,
                 bool fused_batch_norm = true, bool fold_batch_norm = false);
  /// `x` is [N, in_planes, H, W]; returns [N, planes, H / stride,
  /// W / stride] (rounded up), after the final ReLU.
  torch::Tensor forward(torch::Tensor x);
  /// forward() with every BatchNorm folded into the convolutions
  /// (lamp::ops::folded_residual_block), whatever the device and mode:
  /// what forward() runs where `fold_batch_norm` applies; on the CPU the
  /// ATen reference of the fused graphs.
  torch::Tensor forward_folded(
      const torch::Tensor& x,
      ops::FoldedBackend backend = ops::FoldedBackend::kAuto);

  /// 3x3 convolution, `in_planes` -> `planes`, stride `stride`, padding 1.
  torch::nn::Conv2d conv1{nullptr};
  /// BatchNorm of conv1's output.
  torch::nn::BatchNorm2d bn1{nullptr};
  /// 3x3 convolution, `planes` -> `planes`, stride 1, padding 1.
  torch::nn::Conv2d conv2{nullptr};
  /// BatchNorm of conv2's output, before the residual addition.
  torch::nn::BatchNorm2d bn2{nullptr};
  /// Empty (`is_empty()`) when the shortcut is the identity.
  torch::nn::Sequential shortcut{nullptr};

  /// The block's name in its network ("layer2.0"), for the fused path's
  /// messages; ResNetImpl sets it.
  void set_label(std::string label) { label_ = std::move(label); }

 private:
  bool fused_;
  bool fold_;
  std::string label_ = "block";
};
/// The module holder of BasicBlockImpl (a shared pointer to it, as for every
/// torch::nn module): `block->forward(x)`.
TORCH_MODULE(BasicBlock);

/// The residual block of ResNet50/101/152: 1x1 (reduce to `planes`), 3x3
/// (stride `stride`, the "ResNet v1.5" placement used by kuangliu and
/// torchvision), 1x1 (expand to `planes * kExpansion`), each without bias and
/// followed by BatchNorm, ReLU after the first two and after the residual
/// addition.
///
/// Children: "conv1", "bn1", "conv2", "bn2", "conv3", "bn3", and "shortcut"
/// (1x1 convolution + BatchNorm) when the shape changes, as in BasicBlockImpl.
class BottleneckImpl : public torch::nn::Module {
 public:
  /// Output channels per plane: the block outputs `planes * 4` channels.
  static constexpr int64_t kExpansion = 4;

  /// A block from `in_planes` input channels to `planes * kExpansion` output
  /// channels through a `planes`-channel bottleneck; `stride` 2 halves the
  /// height and width (rounding up), in conv2 and in the shortcut.
  /// `fused_batch_norm` and `fold_batch_norm` as in BasicBlockImpl.
  BottleneckImpl(int64_t in_planes, int64_t planes, int64_t stride = 1,
                 bool fused_batch_norm = true, bool fold_batch_norm = false);
  /// `x` is [N, in_planes, H, W]; returns [N, planes * kExpansion,
  /// H / stride, W / stride] (rounded up), after the final ReLU.
  torch::Tensor forward(torch::Tensor x);
  /// As BasicBlockImpl::forward_folded().
  torch::Tensor forward_folded(
      const torch::Tensor& x,
      ops::FoldedBackend backend = ops::FoldedBackend::kAuto);

  /// 1x1 convolution, `in_planes` -> `planes`.
  torch::nn::Conv2d conv1{nullptr};
  /// BatchNorm of conv1's output.
  torch::nn::BatchNorm2d bn1{nullptr};
  /// 3x3 convolution, `planes` -> `planes`, stride `stride`, padding 1.
  torch::nn::Conv2d conv2{nullptr};
  /// BatchNorm of conv2's output.
  torch::nn::BatchNorm2d bn2{nullptr};
  /// 1x1 convolution, `planes` -> `planes * kExpansion`.
  torch::nn::Conv2d conv3{nullptr};
  /// BatchNorm of conv3's output, before the residual addition.
  torch::nn::BatchNorm2d bn3{nullptr};
  /// Empty (`is_empty()`) when the shortcut is the identity.
  torch::nn::Sequential shortcut{nullptr};

  /// As BasicBlockImpl::set_label().
  void set_label(std::string label) { label_ = std::move(label); }

 private:
  bool fused_;
  bool fold_;
  std::string label_ = "block";
};
/// The module holder of BottleneckImpl: `block->forward(x)`.
TORCH_MODULE(Bottleneck);

/// Options of ResNetImpl.
struct ResNetOptions {
  /// ResNet18's layout by default; num_classes 10 and in_channels 3 until set.
  /* implicit */ ResNetOptions(std::vector<int64_t> blocks = {2, 2, 2, 2},
                               bool bottleneck = false)
      : blocks_(std::move(blocks)), bottleneck_(bottleneck) {}

  /// Residual blocks per stage; exactly four positive counts
  /// (ResNet18: {2, 2, 2, 2}).
  TORCH_ARG(std::vector<int64_t>, blocks);
  /// BottleneckImpl blocks (expansion 4) instead of BasicBlockImpl
  /// (expansion 1).
  TORCH_ARG(bool, bottleneck);
  /// Outputs of the final linear layer.
  TORCH_ARG(int64_t, num_classes) = 10;
  /// Channels of the input images (3 for CIFAR, 1 for (Fashion-)MNIST).
  TORCH_ARG(int64_t, in_channels) = 3;
  /// Each BatchNorm with the ReLU (and the residual addition) after it as one
  /// op, lamp::ops::batch_norm_relu / batch_norm_add_relu: one cuDNN kernel
  /// each way on CUDA for channels_last half/bfloat16 activations in
  /// training, the stock ops (exactly) everywhere else. Parameters, buffers
  /// and their names are the same either way; false runs the stock ops
  /// always.
  TORCH_ARG(bool, fused_batch_norm) = true;
  /// Opt-in: every residual block's BatchNorms folded into its convolutions
  /// (lamp::ops::folded_residual_block): on CUDA, in training, for
  /// channels_last half/bfloat16 activations, each convolution computes its
  /// output's BatchNorm statistics in its epilogue and applies the previous
  /// BatchNorm and ReLU in its prologue (cuDNN's graph API), and the
  /// backward fuses likewise; any layer whose graph cuDNN refuses runs the
  /// ATen ops, with one line naming it. Elsewhere (eval mode, the CPU,
  /// FP32, NCHW, a lamp without cudnn-frontend) the blocks run as
  /// fused_batch_norm says. The stem keeps fused_batch_norm's op. Parameters,
  /// buffers and their names are the same either way. The programs'
  /// `--fused-bn conv`.
  TORCH_ARG(bool, fold_batch_norm) = false;
};

/// A CIFAR-style ResNet.
///
/// Steps of forward():
///  1. stem: 3x3 convolution (stride 1, padding 1, no bias) to 64 channels,
///     BatchNorm, ReLU; no max-pool, so 32x32 inputs keep their resolution;
///  2. four stages of 64/128/256/512 planes ("layer1".."layer4", each a
///     Sequential of blocks named "0", "1", ...); the first block of stages
///     2-4 has stride 2;
///  3. adaptive average pooling to 1x1, flatten, linear ("linear") from
///     512 * expansion features to `num_classes` logits.
///
/// Children: "conv1", "bn1", "layer1".."layer4", "linear". Any input size of
/// at least 8x8 works (28x28 MNIST images too), thanks to the adaptive pool;
/// in training, BatchNorm needs more than one value per channel at the last
/// stage (1x1 there for inputs up to 8x8, so a batch of at least 2).
///
/// Example:
/// \code
///   auto model = lamp::models::resnet18();
///   torch::Tensor logits = model->forward(torch::randn({8, 3, 32, 32}));
///   auto bf16 = lamp::network_to_half(model,
///                                     lamp::HalfOptions(torch::kBFloat16));
/// \endcode
///
/// \warning forward() returns logits, not log-probabilities: train with
/// cross_entropy (after `.to(torch::kFloat)` for a converted model).
class ResNetImpl : public torch::nn::Module {
 public:
  /// Builds and registers every child. TORCH_CHECK error unless `blocks`
  /// holds four counts of at least 1 and num_classes and in_channels are at
  /// least 1.
  explicit ResNetImpl(const ResNetOptions& options);
  /// The same, with the options given one by one.
  ResNetImpl(const std::vector<int64_t>& blocks, bool bottleneck,
             int64_t num_classes = 10, int64_t in_channels = 3);

  /// `x` is [N, in_channels, H, W]; returns [N, num_classes] logits. Another
  /// shape is a TORCH_CHECK error that names the expected one.
  torch::Tensor forward(torch::Tensor x);

  /// The options the network was built with.
  const ResNetOptions& options() const { return options_; }

  /// Stem: 3x3 convolution, `in_channels` -> 64, stride 1, padding 1.
  torch::nn::Conv2d conv1{nullptr};
  /// BatchNorm of the stem.
  torch::nn::BatchNorm2d bn1{nullptr};
  /// Stage 1: `blocks[0]` blocks of 64 planes, stride 1.
  torch::nn::Sequential layer1{nullptr};
  /// Stage 2: `blocks[1]` blocks of 128 planes; the first has stride 2.
  torch::nn::Sequential layer2{nullptr};
  /// Stage 3: `blocks[2]` blocks of 256 planes; the first has stride 2.
  torch::nn::Sequential layer3{nullptr};
  /// Stage 4: `blocks[3]` blocks of 512 planes; the first has stride 2.
  torch::nn::Sequential layer4{nullptr};
  /// Classifier: 512 * kExpansion features -> `num_classes` logits.
  torch::nn::Linear linear{nullptr};

 private:
  ResNetOptions options_;
};
/// The module holder of ResNetImpl: `model->forward(x)`.
TORCH_MODULE(ResNet);

/// ResNet18: {2, 2, 2, 2} basic blocks; 11,173,962 parameters for 10 classes.
ResNet resnet18(int64_t num_classes = 10, int64_t in_channels = 3);
/// ResNet34: {3, 4, 6, 3} basic blocks; 21,282,122 parameters for 10 classes.
ResNet resnet34(int64_t num_classes = 10, int64_t in_channels = 3);
/// ResNet50: {3, 4, 6, 3} bottlenecks; 23,520,842 parameters for 10 classes.
ResNet resnet50(int64_t num_classes = 10, int64_t in_channels = 3);
/// ResNet101: {3, 4, 23, 3} bottlenecks; 42,512,970 parameters for 10 classes.
ResNet resnet101(int64_t num_classes = 10, int64_t in_channels = 3);
/// ResNet152: {3, 8, 36, 3} bottlenecks; 58,156,618 parameters for 10
/// classes.
ResNet resnet152(int64_t num_classes = 10, int64_t in_channels = 3);

/// Builds a ResNet by name: "resnet18", "resnet34", "resnet50", "resnet101"
/// or "resnet152". Anything else is a TORCH_CHECK error listing the valid
/// names.
ResNet make_resnet(const std::string& name, int64_t num_classes = 10,
                   int64_t in_channels = 3);

/// The options make_resnet() builds `name` with (its blocks and block type);
/// the same error for an unknown name.
ResNetOptions resnet_options(const std::string& name, int64_t num_classes = 10,
                             int64_t in_channels = 3);

/// The names make_resnet() accepts, smallest first.
const std::vector<std::string>& resnet_names();

/// Number of trainable parameters (those with requires_grad) in `module`'s
/// tree, as `sum(p.numel() for p in model.parameters() if p.requires_grad)`.
int64_t count_parameters(const torch::nn::Module& module);

} // namespace models
} // namespace lamp
