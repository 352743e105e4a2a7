#pragma once

// The GPT the fused ops' tests train: 2 blocks of width 16 over 30 token
// ids, context 8, no dropout (so that two runs can agree to the bit), and
// the twins they compare.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <utility>

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

} // namespace lamp_test
