#include "lamp/optim/decay_groups.h"

#include <torch/nn/modules/embedding.h>

#include <unordered_set>

#include "lamp/nn/norms.h"

namespace lamp {
namespace optim {
namespace {

bool exempt_module(const torch::nn::Module& m) {
  return lamp::nn::is_norm(m) ||
         dynamic_cast<const torch::nn::EmbeddingImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::EmbeddingBagImpl*>(&m) != nullptr;
}

} // namespace

std::set<std::string> no_decay_names(const torch::nn::Module& model) {
  // First the tensors to exempt, by identity: a tied weight is one tensor.
  std::unordered_set<const c10::TensorImpl*> exempt;
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    const bool whole = exempt_module(*item.value());
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      if (p.value().defined() && (whole || p.value().dim() <= 1)) {
        exempt.insert(p.value().unsafeGetTensorImpl());
      }
    }
  }
  std::set<std::string> names;
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      if (p.value().defined() &&
          exempt.count(p.value().unsafeGetTensorImpl()) != 0) {
        names.insert(item.key().empty() ? p.key() : item.key() + "." + p.key());
      }
    }
  }
  return names;
}

namespace detail {

void split_by_decay(const torch::OrderedDict<std::string, torch::Tensor>& named,
                    const std::set<std::string>& no_decay,
                    std::vector<torch::Tensor>& decay,
                    std::vector<torch::Tensor>& exempt) {
  for (const auto& name : no_decay) {
    TORCH_CHECK(named.contains(name), "lamp::optim::decay_groups: '", name,
                "' is not among the ", named.size(),
                " parameters given; take the names from the same model "
                "(lamp::optim::no_decay_names(model)).");
  }
  for (const auto& item : named) {
    (no_decay.count(item.key()) != 0 ? exempt : decay).push_back(item.value());
  }
}

} // namespace detail
} // namespace optim
} // namespace lamp
