#include "lamp/amp/grad_scaler.h"

#include <torch/torch.h>

#include <cstdint>
#include <vector>

// GradScaler's portable kernels: the found-inf check with unscale, and the
// scale update with lamp's bounds and hysteresis, for the devices and dtypes
// ATen's fused _amp_* kernels do not cover.

namespace lamp {
namespace detail {

void non_finite_check_and_unscale_(std::vector<torch::Tensor>& tensors,
                                   torch::Tensor& found_inf,
                                   const torch::Tensor& inv_scale_in) {
  TORCH_CHECK(
      found_inf.numel() == 1 && inv_scale_in.numel() == 1,
      "lamp::detail::non_finite_check_and_unscale_: found_inf and inv_scale must have one element each.");
  const auto inv_scale = inv_scale_in.reshape({});
  for (auto& t : tensors) {
    found_inf.masked_fill_(torch::isfinite(t).all().logical_not(), 1.0);
    // ATen's kernel multiplies in FP32 (double for double tensors) and rounds
    // once to the tensor's dtype; inf and NaN stay what they are.
    if (t.scalar_type() == torch::kHalf ||
        t.scalar_type() == torch::kBFloat16) {
      t.copy_(t.to(torch::kFloat).mul_(inv_scale));
    } else {
      t.mul_(inv_scale);
    }
  }
}

void update_scale_(torch::Tensor& scale, torch::Tensor& growth_tracker,
                   torch::Tensor& overflow_count,
                   const torch::Tensor& found_inf, double growth_factor,
                   double backoff_factor, int64_t growth_interval,
                   double min_scale, double max_scale, int64_t hysteresis,
                   torch::Tensor* min_scale_overflows) {
  TORCH_CHECK(
      scale.numel() == 1 && growth_tracker.numel() == 1 &&
          overflow_count.numel() == 1 && found_inf.numel() == 1,
      "lamp::detail::update_scale_: every state tensor must have one element.");
  const auto inf = found_inf.ne(0);
  // Consecutive overflows, saturating at `hysteresis`; a finite step resets.
  const auto count =
      torch::where(inf, (overflow_count + 1).clamp_max(hysteresis),
                   torch::zeros_like(overflow_count));
  const auto backoff = inf.logical_and(count.ge(hysteresis));

  // As ATen's _amp_update_scale_: products in double, rounded once to FP32.
  const auto scale64 = scale.to(torch::kDouble);
  // Backing off never raises the scale, even one set below min_scale.
  const auto backed_off =
      torch::minimum(scale64, (scale64 * backoff_factor).clamp_min(min_scale))
          .to(torch::kFloat);
  const auto successful = growth_tracker + 1;
  const auto interval_reached = successful.eq(growth_interval);
  const auto grown =
      (scale64 * growth_factor).clamp_max(max_scale).to(torch::kFloat);
  const auto grow = inf.logical_not()
                        .logical_and(interval_reached)
                        .logical_and(torch::isfinite(grown));

  const auto new_scale =
      torch::where(backoff, backed_off, torch::where(grow, grown, scale));
  const auto new_tracker =
      torch::where(inf.logical_or(interval_reached),
                   torch::zeros_like(growth_tracker), successful);
  if (min_scale_overflows != nullptr && min_scale > 0) {
    // Compared in FP32: the clamped scale is min_scale rounded to FP32.
    const auto met_floor = inf.logical_and(scale.le(min_scale));
    auto& met = *min_scale_overflows;
    met.copy_(torch::where(new_scale.gt(min_scale), torch::zeros_like(met),
                           met + met_floor.to(met.scalar_type())));
  }
  scale.copy_(new_scale);
  growth_tracker.copy_(new_tracker);
  overflow_count.copy_(count);
}

} // namespace detail

} // namespace lamp
