#include "amp/grad_scaler_options.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace lamp {
namespace {

// The growth tracker and the overflow count are int32 tensors, as in
// PyTorch: they count up to growth_interval and hysteresis.
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// The checks that the options and the setters share.
void check_growth_factor(double factor, const char* caller) {
  TORCH_CHECK(std::isfinite(factor) && factor > 1.0, caller,
              ": growth_factor must be finite and > 1.0, got ", factor, ".");
}

void check_backoff_factor(double factor, const char* caller) {
  TORCH_CHECK(factor > 0.0 && factor < 1.0, caller,
              ": backoff_factor must be in (0, 1), got ", factor, ".");
}

void check_growth_interval(int64_t interval, const char* caller) {
  TORCH_CHECK(interval > 0 && interval <= kInt32Max, caller,
              ": growth_interval must be in [1, ", kInt32Max,
              "] (the growth tracker is an int32 tensor), got ", interval, ".");
}

} // namespace

namespace detail {

void check_scale(double scale, const char* caller) {
  TORCH_CHECK(std::isfinite(scale) && scale > 0, caller,
              ": the scale must be finite and positive, got ", scale, ".");
  // The scale lives in an FP32 tensor, made at the first scale().
  TORCH_CHECK(
      scale <= std::numeric_limits<float>::max() &&
          static_cast<float>(scale) > 0.0f,
      caller, ": the scale ", scale,
      " is not representable in float32 (the dtype of the scale tensor); use a scale in [",
      std::numeric_limits<float>::denorm_min(), ", ",
      std::numeric_limits<float>::max(), "].");
}

void check_options(const GradScalerOptions& o, double scale,
                   const char* caller) {
  check_scale(scale, caller);
  check_growth_factor(o.growth_factor(), caller);
  check_backoff_factor(o.backoff_factor(), caller);
  check_growth_interval(o.growth_interval(), caller);
  TORCH_CHECK(o.hysteresis() >= 1 && o.hysteresis() <= kInt32Max, caller,
              ": hysteresis must be in [1, ", kInt32Max,
              "] (1 is PyTorch's rule), got ", o.hysteresis(), ".");
  TORCH_CHECK(
      o.min_scale_patience() >= 0 && o.min_scale_patience() <= kInt32Max,
      caller, ": min_scale_patience must be in [0, ", kInt32Max,
      "] (0 = off), got ", o.min_scale_patience(), ".");
  TORCH_CHECK(o.min_scale() >= 0 && o.min_scale() <= o.max_scale(), caller,
              ": need 0 <= min_scale <= max_scale, got min_scale=",
              o.min_scale(), " and max_scale=", o.max_scale(), ".");
  TORCH_CHECK(scale >= o.min_scale() && scale <= o.max_scale(), caller,
              ": the scale ", scale, " lies outside [min_scale, max_scale] = [",
              o.min_scale(), ", ", o.max_scale(), "].");
}

} // namespace detail

void GradScaler::set_growth_factor(double new_factor) {
  constexpr const char* kCaller = "lamp::GradScaler::set_growth_factor";
  detail::InUseGuard in_use(in_use_, kCaller);
  check_growth_factor(new_factor, kCaller);
  options_.growth_factor(new_factor);
}

void GradScaler::set_backoff_factor(double new_factor) {
  constexpr const char* kCaller = "lamp::GradScaler::set_backoff_factor";
  detail::InUseGuard in_use(in_use_, kCaller);
  check_backoff_factor(new_factor, kCaller);
  options_.backoff_factor(new_factor);
}

void GradScaler::set_growth_interval(int64_t new_interval) {
  constexpr const char* kCaller = "lamp::GradScaler::set_growth_interval";
  detail::InUseGuard in_use(in_use_, kCaller);
  check_growth_interval(new_interval, kCaller);
  options_.growth_interval(new_interval);
  // The update grows the scale when the tracker reaches the interval: a
  // tracker already past a shorter one would never meet it again. Clamped
  // on the device (no host read): the next finite step grows the scale.
  init_growth_tracker_ = std::min(init_growth_tracker_, new_interval - 1);
  if (growth_tracker_.defined()) {
    growth_tracker_.clamp_max_(new_interval - 1);
  }
}

} // namespace lamp
