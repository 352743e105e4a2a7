#include "lamp/optim/decay_groups.h"

#include <torch/nn/modules/embedding.h>

#include <unordered_set>

#include "lamp/nn/norms.h"
#include "lamp/platform/parameters.h"

namespace lamp {
namespace optim {
namespace {

// Whether every parameter of `m` is exempt, whatever its shape.
bool exempt_module(const torch::nn::Module& m,
                   const DecayRuleOptions& options) {
  return lamp::nn::is_norm(m) ||
         (options.exempt_embeddings() &&
          (dynamic_cast<const torch::nn::EmbeddingImpl*>(&m) != nullptr ||
           dynamic_cast<const torch::nn::EmbeddingBagImpl*>(&m) != nullptr));
}

} // namespace

bool decays_by_shape(const torch::Tensor& parameter) {
  return parameter.dim() >= 2;
}

std::set<std::string> no_decay_names(const torch::nn::Module& model,
                                     const DecayRuleOptions& options) {
  // First the tensors to exempt, by identity: a tied weight is one tensor.
  std::unordered_set<const c10::TensorImpl*> exempt;
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    const bool whole = exempt_module(*item.value(), options);
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      if (p.value().defined() && (whole || !decays_by_shape(p.value()))) {
        exempt.insert(p.value().unsafeGetTensorImpl());
      }
    }
  }
  // Then their names, one per tensor: the one a TrainStep hands its
  // optimizer factory, so that decay_groups finds every name. A frozen
  // parameter is handed to no optimizer: it is named by none.
  std::set<std::string> names;
  for (const auto& item : unique_named_parameters(model)) {
    if (item.value().defined() && item.value().requires_grad() &&
        exempt.count(item.value().unsafeGetTensorImpl()) != 0) {
      names.insert(item.key());
    }
  }
  return names;
}

namespace detail {

void split_by_decay(const torch::OrderedDict<std::string, torch::Tensor>& named,
                    const std::set<std::string>& no_decay,
                    std::vector<torch::Tensor>& decay,
                    std::vector<torch::Tensor>& exempt) {
  std::unordered_set<const c10::TensorImpl*> exempt_tensors;
  for (const auto& name : no_decay) {
    const auto* found = named.find(name);
    TORCH_CHECK(
        found != nullptr, "lamp::optim::decay_groups: '", name,
        "' is not among the ", named.size(),
        " parameters given; take the names from the same model "
        "(lamp::optim::no_decay_names(model)), which names a tied weight "
        "once, under its first name.");
    exempt_tensors.insert(found->unsafeGetTensorImpl());
  }
  // A tensor given under several names goes to one group, once.
  lamp::detail::TensorIdentitySet seen;
  for (const auto& item : named) {
    if (seen.insert(item.value())) {
      (exempt_tensors.count(item.value().unsafeGetTensorImpl()) != 0 ? exempt
                                                                     : decay)
          .push_back(item.value());
    }
  }
}

} // namespace detail
} // namespace optim
} // namespace lamp
