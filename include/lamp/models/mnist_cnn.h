#pragma once

/// \file
/// The seed article's small CNN for MNIST / Fashion-MNIST.

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

namespace lamp {
namespace models {

/// Two convolution blocks and a linear classifier for 28x28 images.
///
/// Steps of forward():
///  1. "conv1": `in_channels` -> 16 channels, 5x5, padding 2; ReLU;
///     2x2 max-pool (28 -> 14);
///  2. "conv2": 16 -> 32 channels, 5x5, padding 2; ReLU; 2x2 max-pool
///     (14 -> 7);
///  3. flatten, "fc": 32 * 7 * 7 -> `num_classes`;
///  4. log_softmax over dim 1.
///
/// ReLU and max-pool run as one fused op on CPU (lamp::ops::relu_max_pool2d:
/// the same values and gradients as the two stock ops, in one pass).
///
/// Children: "conv1", "conv2", "fc" (28,938 parameters for 1 channel and 10
/// classes). No BatchNorm: network_to_half() converts all of it.
///
/// Example:
/// \code
///   lamp::models::MnistCNN model;
///   torch::Tensor log_probs = model->forward(torch::randn({8, 1, 28, 28}));
///   auto loss = torch::nll_loss(log_probs.to(torch::kFloat), labels);
/// \endcode
///
/// \warning forward() returns log-probabilities, not logits: train with
/// nll_loss. cross_entropy gives the same loss (log_softmax of
/// log-probabilities changes nothing) at the cost of a second log_softmax.
class MnistCNNImpl : public torch::nn::Module {
 public:
  /// Builds and registers the children for `in_channels`-channel 28x28
  /// images and `num_classes` classes; TORCH_CHECK error unless both are at
  /// least 1.
  explicit MnistCNNImpl(int64_t num_classes = 10, int64_t in_channels = 1);

  /// `x` is [N, in_channels, 28, 28]; returns [N, num_classes]
  /// log-probabilities.
  torch::Tensor forward(torch::Tensor x);

  /// Outputs of forward() per image.
  int64_t num_classes() const { return num_classes_; }
  /// Channels of the input images (1 for MNIST and Fashion-MNIST).
  int64_t in_channels() const { return in_channels_; }

  /// 5x5 convolution, `in_channels` -> 16, padding 2.
  torch::nn::Conv2d conv1{nullptr};
  /// 5x5 convolution, 16 -> 32, padding 2.
  torch::nn::Conv2d conv2{nullptr};
  /// Classifier: 32 * 7 * 7 features -> `num_classes`.
  torch::nn::Linear fc{nullptr};

 private:
  int64_t num_classes_;
  int64_t in_channels_;
};
/// The module holder of MnistCNNImpl: `model->forward(x)`.
TORCH_MODULE(MnistCNN);

} // namespace models
} // namespace lamp
