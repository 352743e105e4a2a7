// The FP8 layers' steps and counters: the update of delayed scaling's
// scales, and float8_stats().
#include "lamp/nn/float8.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <tuple>
#include <vector>

#include "nn/float8_internal.h"
#include "nn/float8_scale_cuda.h"

namespace lamp {
namespace nn {

using namespace internal;

void update_float8_scales(
    torch::nn::Module& model,
    const std::function<void(torch::Tensor&)>& all_reduce_max) {
  std::vector<Float8StateImpl*> delayed;
  for (auto* state : states_of(model)) {
    if (state->recipe().scaling() == Float8Scaling::kDelayed) {
      delayed.push_back(state);
    }
  }
  if (delayed.empty()) {
    return;
  }
  torch::NoGradGuard no_grad;
  if (all_reduce_max) {
    std::vector<torch::Tensor> pending;
    pending.reserve(delayed.size());
    for (auto* state : delayed) {
      pending.push_back(state->pending_amax);
    }
    auto all = torch::cat(pending);
    all_reduce_max(all);
    for (size_t i = 0; i < delayed.size(); ++i) {
      delayed[i]->pending_amax.copy_(
          all.narrow(0, static_cast<int64_t>(i) * kOperands, kOperands));
    }
  }
  // Float8Recipe::fused_casts: the layers lamp's kernel takes, all in one
  // launch (per device); the others by the ATen ops below.
  std::vector<Float8StateImpl*> fused;
  std::vector<Float8StateImpl*> unfused;
  for (auto* state : delayed) {
    if (state->recipe().fused_casts() && state->scale.is_cuda()) {
      const auto why = fused_scale_update_unavailable_reason(*state);
      if (why.empty() && (fused.empty() || fused.front()->scale.device() ==
                                               state->scale.device())) {
        fused.push_back(state);
        continue;
      }
      if (!why.empty()) {
        TORCH_WARN_ONCE("lamp::nn::update_float8_scales: Float8Recipe::",
                        "fused_casts runs ATen ops instead of lamp's CUDA ",
                        "kernel: ", why, ".");
      }
    }
    unfused.push_back(state);
  }
  fused_update_scales(fused);
  for (auto* state : unfused) {
    const auto& recipe = state->recipe();
    auto& history = state->amax_history;
    // Newest in column 0; the oldest falls off the end.
    history.copy_(torch::roll(history, /*shifts=*/1, /*dims=*/1));
    history.select(1, 0).copy_(state->pending_amax);
    const auto amax = recipe.amax_compute() == Float8AmaxCompute::kMax
                          ? std::get<0>(history.max(/*dim=*/1))
                          : history.select(1, 0);
    // max / amax / 2^margin per operand, with host scalars only (no copy
    // to the device: the update may be captured in a CUDA graph).
    const double headroom = std::ldexp(1.0, static_cast<int>(recipe.margin()));
    auto fresh = amax.reciprocal();
    fresh.narrow(0, 0, 2).mul_(448.0 / headroom);   // input, weight: E4M3
    fresh.narrow(0, 2, 1).mul_(57344.0 / headroom); // grad_output: E5M2
    // A tiny amax (2e-38) takes max / amax past FP32's range: an inf scale
    // would make the next cast's zeros NaN and its inverse scale 0. The
    // largest finite float instead, as Transformer Engine clamps it.
    fresh.clamp_max_(std::numeric_limits<float>::max());
    // An amax of 0 (a tensor not seen yet, or all zeros) keeps the scale;
    // non-finite amaxes never enter the history (cast_operand).
    state->scale.copy_(torch::where(amax > 0, fresh, state->scale));
    state->pending_amax.zero_();
  }
}

std::vector<Float8LayerStats> float8_stats(const torch::nn::Module& model) {
  std::vector<Float8LayerStats> stats;
  for (auto* state : states_of(model)) {
    const auto counters = state->counters.to(torch::kCPU, torch::kDouble);
    const auto c = counters.accessor<double, 2>();
    Float8LayerStats s;
    s.name = state->name();
    for (int64_t i = 0; i < kOperands; ++i) {
      s.saturated_casts.push_back(static_cast<int64_t>(c[kSaturated][i]));
      s.non_finite_casts.push_back(static_cast<int64_t>(c[kNonFinite][i]));
      s.casts.push_back(static_cast<int64_t>(c[kCasts][i]));
      s.scales.push_back(state->recipe().scaling() == Float8Scaling::kDelayed
                             ? state->scale[i].item<double>()
                             : c[kLastScale][i]);
    }
    stats.push_back(std::move(s));
  }
  return stats;
}

} // namespace nn
} // namespace lamp
