#pragma once

/// \file
/// Analytic FLOP counts of lamp's models, for throughput in TFLOP/s.

#include <cstdint>
#include <string>

namespace lamp {
namespace models {

/// Forward FLOPs of one image through the named model ("resnet18" ...
/// "resnet152" or "cnn", the MNIST CNN): 2 x the multiply-adds of every
/// convolution and linear layer (normalisation, activations and pooling are
/// not counted, as in the usual tables). CIFAR shape (3x32x32, 10 classes):
/// ResNet18 1.111 GFLOP, ResNet34 2.319, ResNet50 2.596.
int64_t forward_flops(const std::string& model, int64_t in_channels = 3,
                      int64_t height = 32, int64_t width = 32,
                      int64_t num_classes = 10);

/// Training FLOPs per image: forward + backward = 3 x forward.
inline int64_t training_flops(const std::string& model, int64_t in_channels = 3,
                              int64_t height = 32, int64_t width = 32,
                              int64_t num_classes = 10) {
  return 3 * forward_flops(model, in_channels, height, width, num_classes);
}

} // namespace models
} // namespace lamp
