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
  /// The module tree: what to move to a device, convert, hand to the
  /// optimizer and checkpoint. forward runs this very object.
  std::shared_ptr<torch::nn::Module> module;
  /// Images [N, C, H, W] -> [N, num_classes]: log-probabilities for "cnn",
  /// logits for the ResNets.
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  /// The training loss from inputs and targets, where the model computes
  /// it together with its head (make_gpt() with
  /// GPTOptions::fused_head_loss: GPTImpl::loss()); for
  /// training::TrainerOptions::training_loss. Unset for the others: the
  /// task's loss of the forward.
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>
      loss = nullptr;
};

/// "cnn" (MnistCNN), then resnet_names() ("resnet18" ... "resnet152").
const std::vector<std::string>& model_names();

/// Refuses a name that is not in model_names(), with `caller` and the list
/// of valid names in the message.
void check_model_name(const std::string& name, const std::string& caller);

/// Builds the named model. An unknown name is an error listing
/// model_names(). `fused_batch_norm` is the ResNets'
/// ResNetOptions::fused_batch_norm (false: the stock BatchNorm and ReLU ops,
/// as the programs' `--fused-bn off`), `fold_batch_norm` their
/// ResNetOptions::fold_batch_norm (the programs' `--fused-bn conv`); "cnn"
/// has no BatchNorm and ignores both.
///
/// \code
///   auto model = lamp::models::make_model("resnet50", /*num_classes=*/10);
///   model.module->to(torch::kCUDA);
///   auto logits = model.forward(images);
/// \endcode
NamedModel make_model(const std::string& name, int64_t num_classes = 10,
                      int64_t in_channels = 3, bool fused_batch_norm = true,
                      bool fold_batch_norm = false);

/// Puts every 4-D parameter of `module`'s tree (convolution weights) in
/// channels_last memory format, in place (`set_data`: the same parameter
/// objects, so optimizers and references stay valid). Feed it channels_last
/// inputs too (data::LoaderOptions::channels_last). Returns `module`.
torch::nn::Module& to_channels_last(torch::nn::Module& module);

} // namespace models
} // namespace lamp
