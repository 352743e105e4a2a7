#pragma once

/// \file
/// `lamp::Autocast`: an RAII guard with `torch.autocast` semantics.

#include <c10/util/Optional.h>
#include <torch/types.h>

namespace lamp {

/// Runs the ops of a scope under autocast, like Python's
/// `with torch.autocast(device_type, dtype, enabled, cache_enabled):`.
///
/// On construction it saves the thread's autocast state for `device_type`
/// (enabled flag and dtype) and the cast-cache flag, sets the new ones and
/// increments the autocast nesting level. On destruction it decrements the
/// nesting level, clears the cast cache when the outermost guard ends, and
/// restores the saved state. Autocast state is thread-local, so is the guard.
///
/// - `dtype` defaults, as in Python, to the thread's current autocast dtype
///   for the device: the device's default (BF16 on CPU, FP16 on CUDA) unless
///   an enclosing guard chose another.
/// - `cache_enabled` defaults, as in Python 2.x, to the current cache flag
///   (on unless an enclosing guard turned it off).
/// - `enabled = false` switches autocast *off* inside an enclosing enabled
///   guard, as `torch.autocast(enabled=False)` does; so
///   `Autocast guard(device, dtype, use_amp)` is the way to make AMP optional.
/// - An enabled guard with a dtype the device's autocast cannot do (anything
///   but FP16/BF16; FP16 on CPU with LibTorch < 2.4) is a `TORCH_CHECK`
///   error raised before any state changes. Devices other than CPU and CUDA
///   are refused the same way.
///
/// Example:
/// \code
///   torch::Tensor loss;
///   {
///     lamp::Autocast autocast(torch::kCUDA);  // FP16 convs and matmuls
///     loss = torch::nll_loss(model->forward(x), y);
///   }
///   scaler.scale(loss).backward();  // backward outside the guard
/// \endcode
///
/// \warning The cast cache keeps low-precision copies of FP32 leaf weights
/// until the outermost guard ends. Keep the optimizer step outside the guard,
/// or updated weights are not re-cast.
class Autocast {
 public:
  /// Saves the thread's autocast state for `device_type`, then sets
  /// `enabled`, `dtype` and `cache_enabled` (defaults: see above). Refuses,
  /// with the state untouched, an enabled guard whose dtype the device cannot
  /// autocast to.
  explicit Autocast(torch::DeviceType device_type,
                    c10::optional<torch::Dtype> dtype = c10::nullopt,
                    bool enabled = true,
                    c10::optional<bool> cache_enabled = c10::nullopt);
  /// Restores the state saved by the constructor.
  ~Autocast();

  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;
  Autocast(Autocast&&) = delete;
  Autocast& operator=(Autocast&&) = delete;

  /// The device type whose autocast state the guard sets.
  torch::DeviceType device_type() const { return device_type_; }
  /// The autocast dtype inside the guard (the default resolved).
  torch::Dtype dtype() const { return dtype_; }
  /// Whether autocast is on inside the guard.
  bool enabled() const { return enabled_; }

  /// The autocast dtype a device uses when none is given: BF16 on CPU, FP16
  /// on CUDA.
  static torch::Dtype default_dtype(torch::DeviceType device_type);

  /// Whether autocast on `device_type` can run in `dtype` with this LibTorch.
  static bool is_supported(torch::DeviceType device_type, torch::Dtype dtype);

  /// Whether autocast is currently on for `device_type` in this thread.
  static bool is_enabled(torch::DeviceType device_type);

  /// The autocast dtype currently set for `device_type` in this thread.
  static torch::Dtype current_dtype(torch::DeviceType device_type);

 private:
  torch::DeviceType device_type_;
  torch::Dtype dtype_;
  bool enabled_;
  bool prev_enabled_;
  torch::Dtype prev_dtype_;
  bool prev_cache_enabled_;
};

} // namespace lamp
