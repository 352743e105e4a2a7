#pragma once

// Checks and cases shared by the fused kernels' tests on a GPU (the _CUDA
// tests) and on the CUDA emulator (tests/emulated_cuda/kernels_test.cpp),
// so that both hold the kernels to the same bounds.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "platform/compat.h"
#include "test_util.h"

#if LAMP_TORCH_FLOAT8
#include "lamp/nn/float8.h"
#endif

namespace lamp_test {

/// |kernel - reference| <= 1e-5 of the sum of the terms' magnitudes, per
/// channel: both add FP32 values, in another order (each block its rows in
/// sequence, then the blocks, against ATen's tree), each rounding within
/// 2^-24 of the running sum; a wrong gate, tensor or channel is off by a
/// whole term.
inline ::testing::AssertionResult SumsAgree(const torch::Tensor& got,
                                            const torch::Tensor& want,
                                            const torch::Tensor& magnitude) {
  const auto error = (got - want).abs();
  const auto bound = 1e-5 * magnitude + 1e-12;
  if (got.sizes() == want.sizes() && error.le(bound).all().item<bool>()) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "largest error " << error.max().item<double>() << " over bound "
         << (error / bound).max().item<double>() << "x";
}

/// The outputs of a residual add + norm and the gradients of its inputs.
struct NormOutputs {
  torch::Tensor sum, normed, x, branch, weight, bias;
};

/// Every output and gradient of `got` within `rtol` (relative to each
/// tensor's largest entry) of `want`, and the sum x + branch to the bit
/// (one addition in FP32, rounded once to the sum's dtype, as ATen's add:
/// a kernel that rounded an operand first would pass `rtol`); dtypes
/// equal.
inline void expect_norm_outputs_close(const NormOutputs& got,
                                      const NormOutputs& want, double rtol,
                                      const std::string& what) {
  SCOPED_TRACE(what);
  const auto peak = [](const torch::Tensor& t) {
    return t.abs().max().item<double>();
  };
  const std::vector<
      std::pair<const char*, std::pair<torch::Tensor, torch::Tensor>>>
      pairs = {{"sum", {got.sum, want.sum}},
               {"normed", {got.normed, want.normed}},
               {"grad x", {got.x, want.x}},
               {"grad branch", {got.branch, want.branch}},
               {"grad weight", {got.weight, want.weight}},
               {"grad bias", {got.bias, want.bias}}};
  for (const auto& [name, p] : pairs) {
    SCOPED_TRACE(name);
    ASSERT_EQ(p.first.defined(), p.second.defined());
    if (!p.first.defined()) {
      continue;
    }
    EXPECT_EQ(p.first.scalar_type(), p.second.scalar_type());
    if (std::string(name) == "sum") {
      EXPECT_TRUE(BitEqual(p.first, p.second));
      continue;
    }
    EXPECT_TRUE(AllClose(p.first, p.second, 0, rtol * peak(p.second) + 1e-30));
  }
}

#if LAMP_TORCH_FLOAT8
/// A recipe of delayed scaling with `history` steps of amaxes.
inline lamp::nn::Float8Recipe delayed_recipe(int64_t history = 4) {
  return lamp::nn::Float8Recipe()
      .scaling(lamp::nn::Float8Scaling::kDelayed)
      .amax_history_len(history);
}

/// Many layers' states of delayed scaling, each with its own recipe
/// (history length, amax_compute, margin) and pending amaxes from a seed,
/// one of them 0 (its scale must stay) in every third layer, and one of
/// them tiny (its scale must stay finite) in every fifth.
struct ScaleUpdateLayers : torch::nn::Module {
  // `last_len`: the last layer's history length where not 0.
  ScaleUpdateLayers(int64_t count, bool fused, torch::Device device,
                    uint64_t seed, int64_t last_len = 0) {
    torch::manual_seed(seed);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t len = i == count - 1 && last_len > 0
                              ? last_len
                              : std::vector<int64_t>{1, 16, 1024}[i % 3];
      auto recipe =
          delayed_recipe(len).margin(i % 4 == 0 ? 2 : 0).fused_casts(fused);
      if (i % 2 == 1) {
        recipe.amax_compute(lamp::nn::Float8AmaxCompute::kMostRecent);
      }
      auto state = lamp::nn::Float8State(recipe, c10::str("layer", i));
      state->to(device);
      state->scale.copy_(torch::rand({3}) * 10);
      states.push_back(register_module(c10::str("s", i), state));
    }
  }
  // A step's amaxes: positive, with an operand of every fifth layer at
  // 2e-38 (max / amax past FP32's range) and one of every third at 0.
  void see(int64_t step) {
    for (size_t i = 0; i < states.size(); ++i) {
      auto amax = torch::rand({3}) * 100 + 0.01;
      if ((i + static_cast<size_t>(step)) % 5 == 0) {
        amax[static_cast<int64_t>((i + 1) % 3)] = 2e-38f;
      }
      if ((i + static_cast<size_t>(step)) % 3 == 0) {
        amax[static_cast<int64_t>(i % 3)] = 0.0f;
      }
      states[i]->pending_amax.copy_(amax);
    }
  }
  std::vector<lamp::nn::Float8State> states;
};

// Both sets see one step's amaxes, drawn from the same seed.
inline void see_both(ScaleUpdateLayers& a, ScaleUpdateLayers& b, uint64_t seed,
                     int64_t step) {
  torch::manual_seed(seed);
  a.see(step);
  torch::manual_seed(seed);
  b.see(step);
}

// The two sets' states agree bit for bit, their scales finite, their
// pending amaxes zeroed.
inline void expect_same_states(const ScaleUpdateLayers& a,
                               const ScaleUpdateLayers& b,
                               const std::string& when) {
  ASSERT_EQ(a.states.size(), b.states.size());
  for (size_t i = 0; i < a.states.size(); ++i) {
    SCOPED_TRACE(c10::str(when, ", layer ", i));
    EXPECT_TRUE(BitEqual(b.states[i]->scale.cpu(), a.states[i]->scale.cpu()));
    EXPECT_TRUE(torch::isfinite(b.states[i]->scale).all().item<bool>());
    EXPECT_TRUE(BitEqual(b.states[i]->amax_history.cpu(),
                         a.states[i]->amax_history.cpu()));
    EXPECT_TRUE(BitEqual(b.states[i]->pending_amax.cpu(), torch::zeros({3})));
  }
}
#endif // LAMP_TORCH_FLOAT8

} // namespace lamp_test
