#pragma once

/// \file
/// lamp's weight-decay rule, nanoGPT's (`configure_optimizers`): the
/// parameters of 2 or more dimensions decay (the weights of Linear, Conv,
/// attention projections and Embedding layers), the others do not (biases,
/// the weights and biases of norms). One rule for no_decay_names(),
/// decay_groups() and make_optimizer's OptimizerOptions::no_bias_decay;
/// DecayRuleOptions::exempt_embeddings exempts embeddings too, as minGPT did.

#include <torch/arg.h>
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

/// How no_decay_names() applies the rule.
struct DecayRuleOptions {
  /// Exempts the weights of Embedding and EmbeddingBag layers too, and so a
  /// head tied to one, as minGPT and early nanoGPT did. Off: they
  /// decay, as in nanoGPT and Hugging Face's Trainer, which exempt only
  /// biases and norms.
  TORCH_ARG(bool, exempt_embeddings) = false;
};

/// The rule by shape alone: whether `parameter` decays, which is whether it
/// has 2 or more dimensions. OptimizerOptions::no_bias_decay applies it to
/// the tensors it is given (make_optimizer sees no modules), and
/// no_decay_names() to every parameter that is not a norm's (or, with
/// exempt_embeddings, an Embedding's).
bool decays_by_shape(const torch::Tensor& parameter);

/// The qualified names ("h.0.ln_1.weight") of `model`'s parameters that take
/// no weight decay:
///  - every parameter of at most one dimension (biases, norms' weights;
///    decays_by_shape());
///  - every parameter of a norm (BatchNorm, InstanceNorm, LayerNorm,
///    GroupNorm, lamp::nn::RMSNorm) whatever its shape: a LayerNorm over
///    [C, H, W] has a 3-D weight, which decays_by_shape() alone would decay;
///  - with `options.exempt_embeddings()`, the weight of every Embedding and
///    EmbeddingBag.
///
/// Each tensor is named once, under the first name it is registered with:
/// the name lamp::unique_named_parameters() keeps, and so the one a
/// TrainStep's NamedParameters holds. A tensor registered under several
/// names (a head tied to the token embedding, `lm_head.weight` being
/// `wte.weight`) is one parameter, exempt when one of its owners exempts it.
/// A frozen parameter (requires_grad false) is named by none: a TrainStep
/// hands the optimizer the trainable ones only, and decay_groups() refuses
/// a name it is not given.
///
/// \warning make_optimizer's no_bias_decay, which sees tensors and not
/// modules, decays a norm's parameter of 2+ dimensions (LayerNorm over
/// [C, H, W]) that this exempts; the two agree on every other parameter
/// while exempt_embeddings is off.
std::set<std::string> no_decay_names(
    const torch::nn::Module& model,
    const DecayRuleOptions& options = DecayRuleOptions());

/// Two param groups of `named` (a TrainStep's NamedParameters: the model's
/// own, or the FP32 masters in "half"/"bf16", by the model's names): the
/// parameters to decay with `defaults` as they are, and those in `no_decay`
/// with `defaults` but weight_decay 0. An empty group is left out. Each
/// tensor goes to one group once: one that `named` holds under several
/// names (model->named_parameters() of a model with tied weights) is exempt
/// when one of them is in `no_decay`. Every name of `no_decay` must be a
/// name of `named`: one that is not (a typo, a model other than the one
/// `named` comes from, or the second name of a tied weight, which
/// NamedParameters leaves out) is an error naming it.
///
/// Example (AdamW as nanoGPT runs it; lamp::optim::make_optimizer with
/// no_bias_decay applies the same rule):
/// \code
///   const auto exempt = lamp::optim::no_decay_names(*model);
///   lamp::TrainStep step(model.ptr(), [&](const lamp::NamedParameters& p) {
///     const auto defaults = torch::optim::AdamWOptions(1e-3)
///                               .betas({0.9, 0.99}).weight_decay(0.1);
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

/// Splits `named` by `no_decay` (see decay_groups), checking every name;
/// each tensor once.
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
