#include "lamp/models/mnist_cnn.h"

#include <torch/types.h>

#include "lamp/ops/relu_max_pool.h"

namespace lamp {
namespace models {

MnistCNNImpl::MnistCNNImpl(int64_t num_classes, int64_t in_channels)
    : num_classes_(num_classes), in_channels_(in_channels) {
  TORCH_CHECK(num_classes >= 1,
              "lamp::models::MnistCNN: num_classes must be at least 1, got ",
              num_classes, ".");
  TORCH_CHECK(in_channels >= 1,
              "lamp::models::MnistCNN: in_channels must be at least 1, got ",
              in_channels, ".");
  conv1 = register_module(
      "conv1", torch::nn::Conv2d(
                   torch::nn::Conv2dOptions(in_channels, 16, 5).padding(2)));
  conv2 = register_module(
      "conv2",
      torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5).padding(2)));
  fc = register_module("fc", torch::nn::Linear(32 * 7 * 7, num_classes));
}

torch::Tensor MnistCNNImpl::forward(torch::Tensor x) {
  // The linear layer's 32 * 7 * 7 inputs fix the image size.
  TORCH_CHECK(x.dim() == 4 && x.size(1) == in_channels_ && x.size(2) == 28 &&
                  x.size(3) == 28,
              "lamp::models::MnistCNN: input must be [N, ", in_channels_,
              ", 28, 28], got ", x.sizes(), ".");
  // relu then max_pool2d, fused (lamp/ops/relu_max_pool.h): the same values
  // and gradients in one pass over each activation.
  auto out = ops::relu_max_pool2d(conv1->forward(x), 2);
  out = ops::relu_max_pool2d(conv2->forward(out), 2);
  out = fc->forward(out.flatten(1));
  return torch::log_softmax(out, /*dim=*/1);
}

} // namespace models
} // namespace lamp
