#pragma once

/// \file
/// The weight-decay split of GPT trainers (nanoGPT, Hugging Face's
/// Trainer): no decay for biases, norms and embeddings, decay for the
/// weights of the layers that compute (Linear, Conv, attention
/// projections).

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

namespace lamp {
namespace optim {

/// The qualified names ("blocks.0.norm1.weight") of `model`'s parameters
/// that take no weight decay: every parameter of a norm (BatchNorm,
/// InstanceNorm, LayerNorm, GroupNorm, lamp::nn::RMSNorm) or an Embedding,
/// and every other parameter of at most one dimension (biases). A tensor
/// registered under several names (tied weights) takes no decay under any
/// of them when one of its owners exempts it.
std::set<std::string> no_decay_names(const torch::nn::Module& model);

/// Two param groups of `named` (a TrainStep's NamedParameters: the model's
/// own, or the FP32 masters in "half"/"bf16", by the model's names): the
/// parameters to decay with `defaults` as they are, and those in `no_decay`
/// with `defaults` but weight_decay 0. An empty group is left out. Errors
/// name a name of `no_decay` that `named` does not hold.
///
/// Example (AdamW as GPT trainers run it):
/// \code
///   const auto exempt = lamp::optim::no_decay_names(*model);
///   lamp::TrainStep step(model.ptr(), [&](const lamp::NamedParameters& p) {
///     const auto defaults = torch::optim::AdamWOptions(6e-4)
///                               .betas({0.9, 0.95}).weight_decay(0.1);
///     return std::make_unique<torch::optim::AdamW>(
///         lamp::optim::decay_groups(p, exempt, defaults), defaults);
///   }, lamp::TrainStepOptions(lamp::Precision::kAuto).max_grad_norm(1.0));
/// \endcode
template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> decay_groups(
    const torch::OrderedDict<std::string, torch::Tensor>& named,
    const std::set<std::string>& no_decay, const Options& defaults);

namespace detail {
/// The param groups of `decay` (with `defaults`) and `exempt` (with
/// `defaults` but weight_decay 0), each left out when empty: decay_groups()
/// and make_optimizer's no_bias_decay.
template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> groups_by_decay(
    std::vector<torch::Tensor> decay, std::vector<torch::Tensor> exempt,
    const Options& defaults) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) {
    groups.emplace_back(std::move(decay), std::make_unique<Options>(defaults));
  }
  if (!exempt.empty()) {
    auto options = std::make_unique<Options>(defaults);
    options->weight_decay(0);
    groups.emplace_back(std::move(exempt), std::move(options));
  }
  return groups;
}

/// Splits `named` by `no_decay` (see decay_groups), checking every name.
void split_by_decay(const torch::OrderedDict<std::string, torch::Tensor>& named,
                    const std::set<std::string>& no_decay,
                    std::vector<torch::Tensor>& decay,
                    std::vector<torch::Tensor>& exempt);
} // namespace detail

template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> decay_groups(
    const torch::OrderedDict<std::string, torch::Tensor>& named,
    const std::set<std::string>& no_decay, const Options& defaults) {
  std::vector<torch::Tensor> decay, exempt;
  detail::split_by_decay(named, no_decay, decay, exempt);
  return detail::groups_by_decay(std::move(decay), std::move(exempt), defaults);
}

} // namespace optim
} // namespace lamp
