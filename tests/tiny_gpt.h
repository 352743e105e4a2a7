#pragma once

// The GPT the fused ops' tests train: 2 blocks of width 16 over 30 token
// ids, context 8, no dropout (so that two runs can agree to the bit), and
// the twins they compare.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "autograd_nodes.h"
#include "lamp/models/gpt.h"

namespace lamp_test {

inline lamp::models::GPTOptions tiny_gpt() {
  return lamp::models::GPTOptions()
      .layers(2)
      .heads(2)
      .width(16)
      .context(8)
      .vocab_size(30)
      .dropout(0);
}

/// `to` takes `from`'s parameters, both moved off their built values by a
/// perturbation from the global generator (biases are built as zeros:
/// random ones, so that a bias left out, or its gradient sent astray,
/// shows).
inline void copy_perturbed_parameters(torch::nn::Module& from,
                                      torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  const auto source = from.parameters();
  const auto target = to.parameters();
  ASSERT_EQ(source.size(), target.size());
  for (size_t i = 0; i < source.size(); ++i) {
    target[i].copy_(source[i].add_(0.05 * torch::randn_like(source[i])));
  }
}

/// A GPT of `plain` and one of `fused` (the same shape, another switch),
/// with the same perturbed weights, seeded.
inline std::pair<lamp::models::GPT, lamp::models::GPT> gpt_twins(
    const lamp::models::GPTOptions& plain,
    const lamp::models::GPTOptions& fused) {
  torch::manual_seed(31);
  lamp::models::GPT a(plain);
  lamp::models::GPT b(fused);
  copy_perturbed_parameters(*a, *b);
  return {a, b};
}

/// One training step of a GPT as the fused ops' tests compare them: the
/// logits, every parameter's gradient, and how many autograd nodes named
/// `node` the step's graph held.
struct GptStep {
  torch::Tensor logits;
  std::vector<torch::Tensor> grads;
  int nodes = 0;
};

/// The forward of `tokens`, then the backward of the logits' mean square.
/// `inspect`, where given, sees the logits with their graph, before the
/// backward.
inline GptStep gpt_step(
    lamp::models::GPT& gpt, const torch::Tensor& tokens,
    const std::string& node,
    const std::function<void(const torch::Tensor&)>& inspect = {}) {
  gpt->zero_grad();
  const auto logits = gpt->forward(tokens);
  GptStep s{logits.detach(), {}, count_nodes_named(logits, node)};
  if (inspect) {
    inspect(logits);
  }
  logits.to(torch::kFloat).square().mean().backward();
  for (const auto& p : gpt->parameters()) {
    s.grads.push_back(p.grad().clone());
  }
  return s;
}

} // namespace lamp_test
