#pragma once

/// \file
/// A module's parameters with each tensor once: tied weights.

#include <torch/nn/module.h>
#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <string>
#include <unordered_set>
#include <vector>

namespace lamp {

/// `module.parameters(recurse)` with each tensor once, in the order of its
/// first occurrence, as Python's `Module.parameters()`.
///
/// LibTorch's Module::parameters() keeps a tensor once per registration: a
/// weight tied between two submodules (an embedding and the output layer
/// that reuses it, `register_parameter("out_weight", embedding->weight)`)
/// appears twice, and an optimizer given that list updates it twice. Two
/// entries are the same tensor when they share their TensorImpl
/// (`a.is_same(b)`); two views of one storage are different tensors. lamp
/// collects parameters this way everywhere (TrainStep, MasterWeights, its
/// optimizers, clipping, GradScaler, DataParallel, the reports); use it for
/// an optimizer of your own over a model with tied weights.
///
/// Example:
/// \code
///   torch::optim::Adam adam(lamp::unique_parameters(*model), 1e-3);
/// \endcode
std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& module,
                                             bool recurse = true);

/// `module.named_parameters(recurse)` with each tensor once, under the first
/// name it is registered with, as Python's `Module.named_parameters()`.
torch::OrderedDict<std::string, torch::Tensor> unique_named_parameters(
    const torch::nn::Module& module, bool recurse = true);

/// `tensors` with each tensor once (the first occurrence, in order).
std::vector<torch::Tensor> unique_tensors(std::vector<torch::Tensor> tensors);

namespace detail {

/// The tensors seen so far, by identity (TensorImpl): insert() is true the
/// first time a tensor is seen. For tree walks that must visit a tied tensor
/// once.
class TensorIdentitySet {
 public:
  bool insert(const torch::Tensor& tensor) {
    return seen_.insert(tensor.unsafeGetTensorImpl()).second;
  }

 private:
  std::unordered_set<const c10::TensorImpl*> seen_;
};

} // namespace detail
} // namespace lamp
