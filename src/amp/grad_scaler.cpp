#include "lamp/amp/grad_scaler.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "amp/grad_scaler_options.h"
#include "lamp/optim/optimizer.h"
#include "lamp/platform/checkpoint_file.h"
#include "lamp/platform/parameters.h"
#include "platform/archive.h"
#include "platform/compat.h"

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

namespace {

bool fused_kernels_for(const torch::Device& device, torch::ScalarType dtype) {
  const bool device_ok =
      device.is_cuda() || (device.is_cpu() && detail::kCpuAmpKernels);
  // ATen's CUDA unscale kernel has no BF16 path; BF16 takes the portable one.
  return device_ok && (dtype == torch::kFloat || dtype == torch::kHalf);
}

} // namespace

namespace detail {

void check_options(const GradScalerOptions& o, double scale,
                   const char* caller) {
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
  TORCH_CHECK(std::isfinite(o.growth_factor()) && o.growth_factor() > 1.0,
              caller, ": growth_factor must be finite and > 1.0, got ",
              o.growth_factor(), ".");
  TORCH_CHECK(o.backoff_factor() > 0.0 && o.backoff_factor() < 1.0, caller,
              ": backoff_factor must be in (0, 1), got ", o.backoff_factor(),
              ".");
  // The growth tracker and the overflow count are int32 tensors, as in
  // PyTorch: they count up to growth_interval and hysteresis.
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  TORCH_CHECK(o.growth_interval() > 0 && o.growth_interval() <= kInt32Max,
              caller, ": growth_interval must be in [1, ", kInt32Max,
              "] (the growth tracker is an int32 tensor), got ",
              o.growth_interval(), ".");
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

GradScaler::GradScaler(GradScalerOptions options)
    : options_(std::move(options)), init_scale_(options_.init_scale()) {
  detail::check_options(options_, init_scale_, "lamp::GradScaler");
}

void GradScaler::lazy_init(const torch::Device& device) {
  const auto options = torch::TensorOptions().device(device);
  scale_ = torch::full({}, init_scale_, options.dtype(torch::kFloat));
  growth_tracker_ =
      torch::full({}, init_growth_tracker_, options.dtype(torch::kInt));
  overflow_count_ =
      torch::full({}, init_overflow_count_, options.dtype(torch::kInt));
  min_scale_overflows_ =
      torch::full({}, init_min_scale_overflows_, options.dtype(torch::kInt));
}

void GradScaler::check_initialized(const char* caller) const {
  TORCH_CHECK(
      scale_.defined(), "lamp::GradScaler::", caller,
      "() was called before scale(): the scaler has no scale yet. Call scaler.scale(loss).backward() earlier in the iteration.");
}

torch::Tensor GradScaler::scale(const torch::Tensor& outputs) {
  if (!options_.enabled()) {
    return outputs;
  }
  TORCH_CHECK(outputs.defined(), "lamp::GradScaler::scale: undefined tensor.");
  if (!scale_.defined()) {
    lazy_init(outputs.device());
  }
  return outputs * scale_.to(outputs.device(), /*non_blocking=*/true);
}

std::vector<torch::Tensor> GradScaler::scale(
    const std::vector<torch::Tensor>& outputs) {
  std::vector<torch::Tensor> scaled;
  scaled.reserve(outputs.size());
  for (const auto& output : outputs) {
    scaled.push_back(scale(output));
  }
  return scaled;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    return;
  }
  check_initialized("unscale_");
  check_and_unscale(optimizer, /*unscale=*/true);
}

void GradScaler::check_and_unscale(torch::optim::Optimizer& optimizer,
                                   bool unscale) {
  auto& state = states_[&optimizer];
  TORCH_CHECK(
      state.stage != Stage::kUnscaled,
      "lamp::GradScaler::unscale_() has already been called on this optimizer since the last update().");
  TORCH_CHECK(
      state.stage != Stage::kStepped,
      "lamp::GradScaler::unscale_() is being called after step(); call update() first.");

  torch::NoGradGuard no_grad; // as Python's _unscale_grads_
  // Python's rule: the inverse is computed in double, then used in FP32.
  // Only checking (the fused optimizers unscale themselves): Python's
  // _check_inf_per_device runs the same kernel with an inverse of 1.
  const auto inv_scale =
      unscale ? scale_.to(torch::kDouble).reciprocal().to(torch::kFloat)
              : torch::ones({}, scale_.options());
  const auto found_inf = torch::zeros({}, scale_.options());

  // Gradients grouped by device, then dtype: one kernel call per group.
  std::map<std::string, std::map<torch::ScalarType, std::vector<torch::Tensor>>>
      groups;
  std::map<std::string, torch::Device> devices;
  // A tensor an optimizer lists twice (a tied weight) is unscaled once.
  detail::TensorIdentitySet seen;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      if (!param.grad().defined() || !seen.insert(param)) {
        continue;
      }
      auto grad = param.grad();
      // Only checking (the fused optimizers unscale in FP32 themselves), as
      // Python's _check_inf_per_device, accepts FP16 gradients.
      TORCH_CHECK(
          !unscale || options_.allow_fp16_grads() ||
              grad.scalar_type() != torch::kHalf,
          "lamp::GradScaler: attempting to unscale FP16 gradients. Unscaled FP16 gradients lose their small values; give the optimizer FP32 master weights (lamp::MasterWeights), or set GradScalerOptions().allow_fp16_grads(true).");
      if (grad.is_sparse()) {
        if (grad.scalar_type() == torch::kHalf) {
          // Coalescing sums duplicate indices, which could overflow FP16.
          param.mutable_grad() = grad.coalesce();
          grad = param.grad();
        }
        grad = grad._values();
      }
      const auto key = grad.device().str();
      devices.emplace(key, grad.device());
      groups[key][grad.scalar_type()].push_back(grad);
    }
  }

  state.found_inf_per_device.clear();
  for (auto& by_device : groups) {
    const auto& device = devices.at(by_device.first);
    auto device_found_inf =
        found_inf.to(device, /*non_blocking=*/true, /*copy=*/true);
    const auto device_inv_scale = inv_scale.to(device, /*non_blocking=*/true);
    for (auto& by_dtype : by_device.second) {
      if (fused_kernels_for(device, by_dtype.first)) {
        at::_amp_foreach_non_finite_check_and_unscale_(
            by_dtype.second, device_found_inf, device_inv_scale);
      } else {
        detail::non_finite_check_and_unscale_(by_dtype.second, device_found_inf,
                                              device_inv_scale);
      }
    }
    state.found_inf_per_device.emplace(by_device.first, device_found_inf);
  }
  if (found_inf_reduction_) {
    // std::map: the same device order in every process.
    for (auto& item : state.found_inf_per_device) {
      found_inf_reduction_(item.second);
    }
  }
  state.stage = unscale ? Stage::kUnscaled : Stage::kChecked;
  if (options_.diagnose_overflow()) {
    record_overflow(optimizer);
  }
}

void GradScaler::record_overflow(torch::optim::Optimizer& optimizer) {
  torch::NoGradGuard no_grad;
  const auto& found = states_.at(&optimizer).found_inf_per_device;
  bool any = false;
  for (const auto& item : found) {
    any = any || item.second.item<float>() != 0.0f;
  }
  if (!any) {
    return;
  }
  last_overflow_.clear();
  auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& grad = params[i].grad();
      if (!grad.defined() ||
          torch::isfinite(grad.is_sparse() ? grad._values() : grad)
              .all()
              .item<bool>()) {
        continue;
      }
      const auto named = names_.find(params[i].unsafeGetTensorImpl());
      last_overflow_.push_back(named != names_.end() &&
                                       !named->second.first.expired()
                                   ? named->second.second
                                   : "param_groups[" + std::to_string(g) +
                                         "].params[" + std::to_string(i) + "]");
    }
  }
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  return step_async(optimizer).item<float>() == 0.0f;
}

namespace {
// The one device of the optimizer's gradients, or nullopt when they are on
// several (or none has a gradient).
c10::optional<torch::Device> gradient_device(
    torch::optim::Optimizer& optimizer) {
  c10::optional<torch::Device> device;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) {
        continue;
      }
      if (device && *device != p.grad().device()) {
        return c10::nullopt;
      }
      device = p.grad().device();
    }
  }
  return device;
}
} // namespace

torch::Tensor GradScaler::step_async(torch::optim::Optimizer& optimizer) {
  detail::InUseGuard in_use(in_use_, "lamp::GradScaler::step");
  if (!options_.enabled()) {
    optimizer.step();
    ++steps_taken_;
    last_found_inf_ = torch::zeros({});
    return last_found_inf_;
  }
  check_initialized("step");
  TORCH_CHECK(
      states_[&optimizer].stage != Stage::kStepped,
      "lamp::GradScaler::step() has already been called since the last update().");
  auto* on_device = dynamic_cast<optim::AmpStep*>(&optimizer);
  const auto device = gradient_device(optimizer);
  const bool sync_free = options_.sync_free() && on_device != nullptr &&
                         on_device->skips_on_device() && device.has_value();
  if (states_[&optimizer].stage == Stage::kReady) {
    // The fused optimizers divide by the scale themselves: only check.
    check_and_unscale(optimizer, /*unscale=*/!sync_free);
  }
  auto& state = states_.at(&optimizer);
  TORCH_CHECK(
      !state.found_inf_per_device.empty(),
      "lamp::GradScaler::step: no inf checks were recorded for this optimizer because none of its parameters has a gradient. Call backward() on the scaled loss before step().");
  torch::Tensor found_inf;
  if (sync_free) {
    // Unscale (unless unscale_() did), skip and count on the device.
    found_inf = state.found_inf_per_device.begin()->second;
    on_device->step_scaled(
        state.stage == Stage::kChecked ? scale_.to(*device) : torch::Tensor(),
        found_inf);
    if (!device_skipped_.defined()) {
      device_skipped_ = torch::zeros({}, scale_.options());
      device_steps_ = torch::zeros({}, scale_.options().dtype(torch::kLong));
    }
    device_skipped_.add_(found_inf.to(scale_.device(), /*non_blocking=*/true));
    device_steps_.add_(1);
  } else {
    // The one host sync of the step, as in Python: the skip decision.
    float any = 0.0f;
    for (const auto& item : state.found_inf_per_device) {
      any += item.second.item<float>();
    }
    const bool stepped = any == 0.0f;
    if (stepped) {
      optimizer.step();
      ++steps_taken_;
    } else {
      ++steps_skipped_;
    }
    found_inf = torch::full({}, stepped ? 0.0f : 1.0f);
  }
  last_found_inf_ = found_inf;
  state.stage = Stage::kStepped;
  return found_inf;
}

int64_t GradScaler::steps_skipped() const {
  return steps_skipped_ +
         (device_skipped_.defined()
              ? static_cast<int64_t>(device_skipped_.item<float>())
              : 0);
}

int64_t GradScaler::steps_taken() const {
  const int64_t device_steps =
      device_steps_.defined() ? device_steps_.item<int64_t>() : 0;
  return steps_taken_ + device_steps - (steps_skipped() - steps_skipped_);
}

bool GradScaler::last_step_skipped() const {
  return last_found_inf_.defined() && last_found_inf_.item<float>() != 0.0f;
}

bool GradScaler::uses_fused_update() const {
  // min_scale > 0 also takes the portable path for min_scale_patience's
  // count.
  const bool python_rule = options_.hysteresis() == 1 &&
                           options_.min_scale() == 0.0 &&
                           std::isinf(options_.max_scale());
  return python_rule &&
         (scale_.is_cuda() || (scale_.is_cpu() && detail::kCpuAmpKernels));
}

void GradScaler::update() {
  detail::InUseGuard in_use(in_use_, "lamp::GradScaler::update");
  if (!options_.enabled()) {
    return;
  }
  check_initialized("update");
  std::vector<torch::Tensor> found_infs;
  for (const auto& state : states_) {
    for (const auto& item : state.second.found_inf_per_device) {
      found_infs.push_back(
          item.second.to(scale_.device(), /*non_blocking=*/true));
    }
  }
  TORCH_CHECK(
      !found_infs.empty(),
      "lamp::GradScaler::update: no inf checks were recorded prior to update(); call step() (or unscale_()) for at least one optimizer in this iteration.");
  auto found_inf = found_infs[0];
  for (size_t i = 1; i < found_infs.size(); ++i) {
    found_inf = found_inf + found_infs[i];
  }
  if (options_.dynamic()) {
    if (uses_fused_update()) {
      at::_amp_update_scale_(
          scale_, growth_tracker_, found_inf, options_.growth_factor(),
          options_.backoff_factor(), options_.growth_interval());
    } else {
      detail::update_scale_(
          scale_, growth_tracker_, overflow_count_, found_inf,
          options_.growth_factor(), options_.backoff_factor(),
          options_.growth_interval(), options_.min_scale(),
          options_.max_scale(), options_.hysteresis(),
          options_.min_scale_patience() > 0 ? &min_scale_overflows_ : nullptr);
    }
  }
  states_.clear();
  if (options_.min_scale_patience() > 0 && scale_.is_cpu()) {
    check_min_scale_patience(); // free on the CPU; see the declaration
  }
}

int64_t GradScaler::min_scale_overflows() const {
  return min_scale_overflows_.defined() ? min_scale_overflows_.item<int>()
                                        : init_min_scale_overflows_;
}

void GradScaler::check_min_scale_patience() const {
  const int64_t patience = options_.min_scale_patience();
  if (!options_.enabled() || patience <= 0) {
    return;
  }
  const int64_t met = min_scale_overflows();
  TORCH_CHECK(
      met < patience,
      "lamp::GradScaler: the loss scale is stuck at its minimum (min_scale=",
      options_.min_scale(), "): ", met,
      " steps overflowed at that scale since it was last above it (min_scale_patience=",
      patience,
      "), so their gradients hold inf/NaN even at the smallest scale allowed and they were skipped. Train in BF16 (lamp::Precision::kAMPBF16; the programs' --precision amp-bf16), lower the learning rate, or clip the gradients (TrainStepOptions::max_grad_norm; --max-grad-norm).");
}

void GradScaler::update(double new_scale) {
  detail::InUseGuard in_use(in_use_, "lamp::GradScaler::update");
  if (!options_.enabled()) {
    return;
  }
  check_initialized("update");
  TORCH_CHECK(
      std::isfinite(new_scale) && new_scale > 0,
      "lamp::GradScaler::update: new_scale must be finite and positive, got ",
      new_scale, ".");
  scale_.fill_(std::min(std::max(new_scale, options_.min_scale()),
                        options_.max_scale()));
  states_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled()) {
    return 1.0;
  }
  return scale_.defined() ? static_cast<double>(scale_.item<float>())
                          : init_scale_;
}

int64_t GradScaler::growth_tracker() const {
  return growth_tracker_.defined() ? growth_tracker_.item<int>()
                                   : init_growth_tracker_;
}

void GradScaler::set_parameter_names(const std::vector<std::string>& names,
                                     const std::vector<torch::Tensor>& params) {
  TORCH_CHECK(names.size() == params.size(),
              "lamp::GradScaler::set_parameter_names: ", names.size(),
              " names for ", params.size(), " parameters.");
  for (size_t i = 0; i < names.size(); ++i) {
    // The weak reference keeps the TensorImpl's memory (not its data) from
    // being reused by another tensor while the name is registered.
    names_.insert_or_assign(
        params[i].unsafeGetTensorImpl(),
        std::make_pair(WeakTensorImpl(params[i].getIntrusivePtr()), names[i]));
  }
}

} // namespace lamp
