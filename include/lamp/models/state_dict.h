#pragma once

/// \file
/// Exports a model's weights as the `state_dict` of its Python twin, for
/// Python's `torch.load` + `model.load_state_dict`.

#include <ATen/core/Dict.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <string>
#include <vector>

namespace lamp {

class MasterWeights;

namespace models {

/// Options of python_state_dict() and export_state_dict().
struct StateDictOptions {
  /// The type of master_weights: a pointer the options do not own.
  using MasterWeightsPtr = const MasterWeights*;

  /// Floating-point tensors in FP32, as a Python model has them before any
  /// conversion, whatever the model's dtype (FP16/BF16 after
  /// network_to_half()). false: each tensor keeps the model's dtype, for a
  /// Python model converted the same way. Integer buffers
  /// (`num_batches_tracked`, int64) keep their dtype either way.
  TORCH_ARG(bool, fp32) = true;
  /// The FP32 master weights of a converted model
  /// (training::TrainStep::master_weights()): with `fp32`, every parameter
  /// they hold is exported from its master copy instead of from the
  /// FP16/BF16 model copy, which is the master rounded. Not owned.
  TORCH_ARG(MasterWeightsPtr, master_weights) = nullptr;
};

/// The model names python_state_dict() maps: "cnn" (MnistCNN) and
/// resnet_names(), as `make_model` in bench/peer_pytorch.py names them.
const std::vector<std::string>& python_model_names();

/// `model`'s parameters and buffers as `model.state_dict()` of the Python
/// model of the same name in bench/peer_pytorch.py (`MnistCNN` for "cnn",
/// `ResNet(BasicBlock | Bottleneck, blocks)` for the ResNets): the same keys
/// ("conv1.weight", "layer2.0.shortcut.1.running_mean", "linear.bias"), in
/// Python's order (each module's parameters, then its buffers, then its
/// children), on the CPU, detached and contiguous.
///
/// lamp's models register their children under the Python attribute names,
/// so the keys are LibTorch's own; the walk checks that `model` is the lamp
/// model `model_name` builds (MnistCNN; a ResNet with that name's blocks)
/// and that every module in it is one Python has (Conv2d, BatchNorm2d,
/// Linear, Sequential, the blocks), and refuses anything else with an error
/// naming the module. A model wrapped by network_to_half()
/// (`Sequential(InputCast, model)`) is unwrapped.
c10::Dict<std::string, torch::Tensor> python_state_dict(
    const torch::nn::Module& model, const std::string& model_name,
    const StateDictOptions& options = {});

/// `module`'s parameters and buffers as Python's `module.state_dict()` gives
/// them for the same module tree, for any torch::nn::Module (a user's own,
/// or lamp's): the keys are the registered names joined with dots, in
/// Python's order (each module's parameters, then its buffers, then its
/// children, recursively, in registration order), on the CPU, detached and
/// contiguous. LibTorch's containers name their children as Python's do
/// (Sequential and ModuleList "0", "1", ...; ModuleDict its keys), and its
/// layers register the parameters and buffers Python's have, in the same
/// order (BatchNorm: weight, bias, running_mean, running_var,
/// num_batches_tracked); an undefined tensor (Linear without bias,
/// BatchNorm without running statistics) is left out, as Python leaves out
/// its None. A custom module's keys are the names it registers: give
/// register_module/register_parameter/register_buffer the Python attribute
/// names, in the order Python's `__init__` assigns them. All of LibTorch's
/// buffers are persistent (it has no `persistent=False`). A model wrapped
/// by network_to_half() is unwrapped.
///
/// Example:
/// \code
///   struct NetImpl : torch::nn::Module {
///     NetImpl() {
///       features = register_module("features", torch::nn::Sequential(
///           torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8)));
///       head = register_module("head", torch::nn::Linear(8, 2));
///     }
///     torch::nn::Sequential features{nullptr};
///     torch::nn::Linear head{nullptr};
///   };
///   // keys: features.0.weight, features.0.bias, features.1.weight, ...,
///   // features.1.num_batches_tracked, head.weight, head.bias
///   lamp::models::export_state_dict(*net, "net.pt");
/// \endcode
c10::Dict<std::string, torch::Tensor> python_state_dict(
    const torch::nn::Module& module, const StateDictOptions& options = {});

/// Writes python_state_dict(module, options) to `path` in the format of
/// Python's `torch.save`, atomically; in Python, `net.load_state_dict(
/// torch.load(path))` into the same module tree (strict).
void export_state_dict(const torch::nn::Module& module, const std::string& path,
                       const StateDictOptions& options = {});

/// Writes python_state_dict() to `path` in the format of Python's
/// `torch.save`, atomically (save_pickle(): a failed write leaves
/// `path` as it was).
///
/// Example:
/// \code
///   lamp::models::export_state_dict(*model, "resnet18", "resnet18.pt");
/// \endcode
/// and in Python, next to bench/peer_pytorch.py:
/// \code
///   import torch, peer_pytorch
///   model = peer_pytorch.make_model("resnet18")
///   model.load_state_dict(torch.load("resnet18.pt"))
/// \endcode
///
/// \warning The file holds weights only, no optimizer or scaler state: it is
/// for inference or fine-tuning in Python, not for resuming lamp's run (use
/// the checkpoint for that).
void export_state_dict(const torch::nn::Module& model,
                       const std::string& model_name, const std::string& path,
                       const StateDictOptions& options = {});

} // namespace models
} // namespace lamp
