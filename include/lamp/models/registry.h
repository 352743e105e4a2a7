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

#include "lamp/amp/half.h"

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

/// Puts every 4-D parameter of `module`'s tree (convolution weights) in
/// channels_last memory format, in place (`set_data`: the same parameter
/// objects, so optimizers and references stay valid). Feed it channels_last
/// inputs too (data::LoaderOptions::channels_last). Returns `module`.
torch::nn::Module& to_channels_last(torch::nn::Module& module);

/// lamp::network_to_half() for a model built by name: converts
/// `model.module` in place (convert_network: FP16 or BF16, BatchNorm kept
/// FP32) and puts an InputCast in front of its forward, so callers feed FP32
/// data and never cast inputs themselves. The module keeps its parameter
/// names (network_to_half's Sequential would prefix them with "1."), so
/// checkpoints and state dicts read the same in every mode.
///
/// \code
///   auto model = lamp::models::make_model("resnet18");
///   model = lamp::models::network_to_half(model,
///   lamp::HalfOptions(torch::kBFloat16)); auto logits =
///   model.forward(fp32_images).to(torch::kFloat);
/// \endcode
NamedModel network_to_half(NamedModel model, const HalfOptions& options = {});

} // namespace models
} // namespace lamp
