#include "lamp/platform/parameters.h"

#include <utility>

namespace lamp {

std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& module,
                                             bool recurse) {
  return unique_tensors(module.parameters(recurse));
}

torch::OrderedDict<std::string, torch::Tensor> unique_named_parameters(
    const torch::nn::Module& module, bool recurse) {
  detail::TensorIdentitySet seen;
  torch::OrderedDict<std::string, torch::Tensor> unique;
  for (const auto& item : module.named_parameters(recurse)) {
    if (seen.insert(item.value())) {
      unique.insert(item.key(), item.value());
    }
  }
  return unique;
}

std::vector<torch::Tensor> unique_tensors(std::vector<torch::Tensor> tensors) {
  detail::TensorIdentitySet seen;
  std::vector<torch::Tensor> unique;
  unique.reserve(tensors.size());
  for (auto& t : tensors) {
    if (seen.insert(t)) {
      unique.push_back(std::move(t));
    }
  }
  return unique;
}

} // namespace lamp
