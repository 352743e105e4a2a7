#include "lamp/amp/autocast.h"

#include "amp/autocast_norms.h"
#include "platform/compat.h"

namespace lamp {

torch::Dtype Autocast::default_dtype(torch::DeviceType device_type) {
  detail::check_autocast_device(device_type);
  return device_type == torch::kCUDA ? torch::kHalf : torch::kBFloat16;
}

bool Autocast::is_supported(torch::DeviceType device_type, torch::Dtype dtype) {
  if (device_type != torch::kCPU && device_type != torch::kCUDA) {
    return false;
  }
  if (dtype == torch::kBFloat16) {
    return true;
  }
  if (dtype == torch::kHalf) {
    return device_type == torch::kCUDA || detail::kCpuAutocastSupportsHalf;
  }
  return false;
}

bool Autocast::is_enabled(torch::DeviceType device_type) {
  return detail::autocast_enabled(device_type);
}

torch::Dtype Autocast::current_dtype(torch::DeviceType device_type) {
  return detail::autocast_dtype(device_type);
}

Autocast::Autocast(torch::DeviceType device_type,
                   c10::optional<torch::Dtype> dtype, bool enabled,
                   c10::optional<bool> cache_enabled)
    : device_type_(device_type),
      dtype_(dtype.has_value() ? *dtype : detail::autocast_dtype(device_type)),
      enabled_(enabled) {
  // Everything is checked before the first state change, so a refused guard
  // leaves the thread's autocast state untouched. As in Python, a disabled
  // guard does not care about the dtype. The device comes first, so that a
  // device autocast does not know is named as the problem, not the dtype.
  detail::check_autocast_device(device_type_);
  TORCH_CHECK(
      !enabled_ || is_supported(device_type_, dtype_),
      "lamp::Autocast: autocast on ", device_type_, " cannot run in ", dtype_,
      (device_type_ == torch::kCPU && dtype_ == torch::kHalf
           ? " with this LibTorch (CPU autocast supports FP16 from LibTorch 2.4 on); use torch::kBFloat16 on CPU"
           : "; use torch::kHalf or torch::kBFloat16"),
      ".");
  if (enabled_ && device_type_ == torch::kCPU) {
    detail::ensure_cpu_autocast_norms();
  }
  prev_enabled_ = detail::autocast_enabled(device_type_);
  prev_dtype_ = detail::autocast_dtype(device_type_);
  prev_cache_enabled_ = at::autocast::is_autocast_cache_enabled();

  detail::set_autocast_enabled(device_type_, enabled_);
  // A disabled guard's dtype only matters to guards nested inside it; ATen
  // refuses to store one the device cannot do, so such a dtype is not set.
  if (is_supported(device_type_, dtype_)) {
    detail::set_autocast_dtype(device_type_, dtype_);
  }
  at::autocast::increment_nesting();
  at::autocast::set_autocast_cache_enabled(
      cache_enabled.value_or(prev_cache_enabled_));
}

Autocast::~Autocast() {
  // Same order as torch.autocast.__exit__: the cache goes when the outermost
  // guard ends, then the saved state comes back.
  if (at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();
  }
  detail::set_autocast_enabled(device_type_, prev_enabled_);
  detail::set_autocast_dtype(device_type_, prev_dtype_);
  at::autocast::set_autocast_cache_enabled(prev_cache_enabled_);
}

} // namespace lamp
