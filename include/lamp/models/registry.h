#pragma once

/// \file
/// lamp's models by name: one table for the programs, the benchmark and the
/// FLOP counts (lamp/models/flops.h).

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace lamp {
namespace models {

/// A model built by name: the module (for TrainStep, checkpoints and
/// conversion) and its forward pass.
struct NamedModel {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
};

/// "cnn" (MnistCNN), then resnet_names() ("resnet18" ... "resnet152").
const std::vector<std::string>& model_names();

/// Refuses a name that is not in model_names(), with `caller` and the list
/// of valid names in the message.
void check_model_name(const std::string& name, const std::string& caller);

/// Builds the named model. An unknown name is an error listing
/// model_names().
///
/// \code
///   auto model = lamp::models::make_model("resnet50", /*num_classes=*/10);
///   model.module->to(torch::kCUDA);
///   auto logits = model.forward(images);
/// \endcode
NamedModel make_model(const std::string& name, int64_t num_classes = 10,
                      int64_t in_channels = 3);

} // namespace models
} // namespace lamp
