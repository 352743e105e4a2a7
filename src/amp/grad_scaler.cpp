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
namespace {

bool fused_kernels_for(const torch::Device& device, torch::ScalarType dtype) {
  const bool device_ok =
      device.is_cuda() || (device.is_cpu() && detail::kCpuAmpKernels);
  // ATen's CUDA unscale kernel has no BF16 path; BF16 takes the portable one.
  return device_ok && (dtype == torch::kFloat || dtype == torch::kHalf);
}

} // namespace

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
  // Clamped first, so that max_scale's bound holds for any new_scale; then
  // what the FP32 scale tensor cannot hold is refused, as the constructor
  // and load() refuse it (FP32 would make it inf, or 0: a scale that never
  // recovers).
  const double clamped =
      std::min(std::max(new_scale, options_.min_scale()), options_.max_scale());
  detail::check_scale(clamped, "lamp::GradScaler::update");
  scale_.fill_(clamped);
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
