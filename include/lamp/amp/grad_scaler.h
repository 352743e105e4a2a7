#pragma once

/// \file
/// Dynamic loss scaling with `torch.amp.GradScaler`'s semantics, plus bounds,
/// hysteresis, a static mode and overflow diagnostics.

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lamp/platform/in_use.h"

namespace lamp {

/// Options of GradScaler. Where Python's GradScaler has the knob, the name and
/// the default are Python's.
struct GradScalerOptions {
  /// Scale before the first update.
  TORCH_ARG(double, init_scale) = 65536.0;
  /// Factor applied after `growth_interval` consecutive finite steps (> 1).
  TORCH_ARG(double, growth_factor) = 2.0;
  /// Factor applied on backoff (in (0, 1)).
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Consecutive finite steps before the scale grows.
  TORCH_ARG(int64_t, growth_interval) = 2000;
  /// A disabled scaler is a no-op: scale() returns its input, step() just
  /// steps.
  TORCH_ARG(bool, enabled) = true;
  /// The scale never backs off below this (Apex's `min_loss_scale`).
  TORCH_ARG(double, min_scale) = 0.0;
  /// The scale never grows above this (Apex's `max_loss_scale`).
  TORCH_ARG(double, max_scale) = std::numeric_limits<double>::infinity();
  /// Back off only on the N-th consecutive overflowing step, and on every
  /// overflowing step after it until a finite step resets the count
  /// (DeepSpeed's `hysteresis` with `consecutive_hysteresis=True`). Every
  /// overflowing step is skipped regardless. 1 is exactly PyTorch's rule.
  TORCH_ARG(int64_t, hysteresis) = 1;
  /// false: a static loss scale; update() never changes it, but steps with
  /// non-finite gradients are still skipped.
  TORCH_ARG(bool, dynamic) = true;
  /// Allow unscaling FP16 gradients in place. Python refuses them ("Attempting
  /// to unscale FP16 gradients."): unscaled FP16 gradients lose their small
  /// values again. Keep FP32 master gradients (lamp::MasterWeights) instead.
  TORCH_ARG(bool, allow_fp16_grads) = false;
  /// On a step with non-finite gradients, record which parameters had them
  /// (see GradScaler::last_overflow()). Costs a host sync per unscale, so off
  /// by default.
  TORCH_ARG(bool, diagnose_overflow) = false;
  /// With an optimizer that can skip on the device (lamp::optim's SGD, Adam
  /// and AdamW on their fused kernels: optim::AmpStep), step() hands it the
  /// scale and the overflow flag instead of unscaling, reading the flag on
  /// the host and calling step(): a training step then never waits for the
  /// GPU. false: always the synchronous path. Same results either way.
  TORCH_ARG(bool, sync_free) = true;
  /// Stop with a c10::Error once this many overflowing steps have met the
  /// scale at `min_scale` (where it cannot back off any further) since it was
  /// last above it: the gradients then overflow even at the smallest scale
  /// allowed, and every such step is skipped (DeepSpeed's
  /// `raise_error_at_min_scale`, which stops at the first). The count
  /// survives finite steps and resets only when the scale grows above
  /// `min_scale`. 0 = off (the default, Python's behaviour); counts nothing
  /// while `min_scale` is 0. The count lives on the scale's device: see
  /// GradScaler::check_min_scale_patience() for when it is read.
  TORCH_ARG(int64_t, min_scale_patience) = 0;
};

/// Dynamic loss scaling, as Python's `torch.amp.GradScaler`:
///
///  1. `scale(loss)` multiplies the loss by the scale S before backward, so
///     small gradients survive FP16;
///  2. `unscale_(optimizer)` (optional, e.g. before gradient clipping) checks
///     the optimizer's gradients for inf/NaN and divides them by S in place;
///  3. `step(optimizer)` unscales if not done yet, then calls
///     `optimizer.step()` only if every gradient was finite;
///  4. `update()` adjusts S: an overflow backs it off and resets the growth
///     count; `growth_interval` finite steps in a row grow it.
///
/// Each optimizer goes READY -> UNSCALED -> STEPPED and back to READY on
/// update(); unscale_() twice, or after step(), is an error, as in Python.
/// Several losses (scale each), several optimizers (unscale_/step each, one
/// update) and gradient accumulation (scale every micro-batch, step once) all
/// work.
///
/// Unlike Python 1.13's `torch.cuda.amp.GradScaler`, the scaler is active on
/// every device. On CUDA it uses ATen's fused kernels
/// (`_amp_foreach_non_finite_check_and_unscale_`, `_amp_update_scale_`); on
/// CPU, and for what those kernels cannot do (BF16 gradients, bounds,
/// hysteresis), a portable path with identical results. Neither syncs with
/// the host except step(), which reads the found-inf flag as Python does.
///
/// Thread safety: one thread at a time per scaler; step() or update() called
/// from a second thread while one of them runs throws a c10::Error saying
/// so. Different scalers on different threads are fine.
///
/// Example:
/// \code
///   lamp::GradScaler scaler;
///   for (auto& batch : loader) {
///     optimizer.zero_grad();
///     torch::Tensor loss;
///     {
///       lamp::Autocast autocast(torch::kCUDA);
///       loss = torch::nll_loss(model->forward(batch.data), batch.target);
///     }
///     scaler.scale(loss).backward();
///     scaler.unscale_(optimizer);  // optional: clip true gradients
///     torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
///     bool stepped = scaler.step(optimizer);
///     scaler.update();
///   }
/// \endcode
class GradScaler {
 public:
  /// A scaler with `options`, checked here: TORCH_CHECK error for an
  /// init_scale that is not finite, positive and representable in FP32, a
  /// growth_factor <= 1, a backoff_factor outside (0, 1), a growth_interval
  /// or hysteresis outside [1, 2^31 - 1], or an init_scale outside
  /// [min_scale, max_scale]. No tensor is made before the first scale().
  explicit GradScaler(GradScalerOptions options = {});

  /// `outputs * scale`. The scale tensor is created on the first call, on the
  /// outputs' device.
  torch::Tensor scale(const torch::Tensor& outputs);
  /// scale() of each of several losses or outputs, in order.
  std::vector<torch::Tensor> scale(const std::vector<torch::Tensor>& outputs);

  /// Divides the optimizer's gradients by the scale in place and records
  /// whether any was inf/NaN.
  void unscale_(torch::optim::Optimizer& optimizer);

  /// Unscales if needed, then steps the optimizer unless a gradient was
  /// non-finite. Returns whether the optimizer stepped, which reads the
  /// overflow flag on the host; step_async() does not.
  bool step(torch::optim::Optimizer& optimizer);
  /// step() without waiting for the device where the optimizer can skip on
  /// it (optim::AmpStep::skips_on_device() and `sync_free`): the gradients
  /// are only checked here; the optimizer divides them by the scale and
  /// skips the step where the flag is set, all on the device. Other
  /// optimizers take the synchronous path (unscale, read the flag, step).
  /// Returns the overflow flag, a one-element FP32 tensor: 1 where the step
  /// was skipped.
  torch::Tensor step_async(torch::optim::Optimizer& optimizer);

  /// Adjusts the scale from this iteration's overflow checks (all optimizers
  /// together) and resets every optimizer to READY.
  void update();
  /// Sets the scale to `new_scale` instead (Python's `update(new_scale)`),
  /// clamped to [min_scale, max_scale]. A clamped value FP32 cannot hold
  /// (beyond FLT_MAX, or below its smallest subnormal) is refused, as the
  /// constructor refuses it, where Python would fail on the first or keep a
  /// scale of 0.
  void update(double new_scale);

  /// The current scale (syncs with the device); the init scale before the
  /// first scale(); 1.0 when disabled.
  double get_scale() const;
  /// The device tensor holding the scale (undefined before the first scale()).
  const torch::Tensor& scale_tensor() const { return scale_; }
  /// Consecutive finite steps since the last growth or overflow.
  int64_t growth_tracker() const;
  /// Overflowing steps that met the scale at `min_scale` since it was last
  /// above it (GradScalerOptions::min_scale_patience); a host read.
  int64_t min_scale_overflows() const;
  /// Throws a c10::Error, with what to change, when min_scale_overflows()
  /// has reached GradScalerOptions::min_scale_patience (> 0). update() calls
  /// it where reading the count costs no wait, that is when the scale lives
  /// on the CPU; on a GPU the count stays on the device (a host read per
  /// step would stall sync-free steps and cannot run inside a CUDA graph),
  /// so the caller checks where it reads the device anyway: lamp's trainer
  /// does once per `divergence_patience` steps and at the end of each epoch.
  void check_min_scale_patience() const;
  /// Python's `get_growth_factor()`: the factor the scale grows by
  /// (GradScalerOptions::growth_factor, or the last set_growth_factor()).
  double get_growth_factor() const { return options_.growth_factor(); }
  /// Python's `set_growth_factor(new_factor)`: updates from now on grow the
  /// scale by `new_factor`. TORCH_CHECK error unless it is finite and > 1,
  /// the range GradScalerOptions checks (Python checks nothing here). A
  /// TrainStep whose step was captured in a CUDA graph captures it again.
  ///
  /// Example:
  /// \code
  ///   scaler.set_growth_factor(1.5);
  ///   assert(scaler.get_growth_factor() == 1.5);
  /// \endcode
  void set_growth_factor(double new_factor);
  /// Python's `get_backoff_factor()`: the factor an overflow multiplies the
  /// scale by (GradScalerOptions::backoff_factor, or the last
  /// set_backoff_factor()).
  double get_backoff_factor() const { return options_.backoff_factor(); }
  /// Python's `set_backoff_factor(new_factor)`: updates from now on back off
  /// by `new_factor`; TORCH_CHECK error unless it is in (0, 1).
  void set_backoff_factor(double new_factor);
  /// Python's `get_growth_interval()`: the consecutive finite steps before
  /// the scale grows (GradScalerOptions::growth_interval, or the last
  /// set_growth_interval()).
  int64_t get_growth_interval() const { return options_.growth_interval(); }
  /// Python's `set_growth_interval(new_interval)`: TORCH_CHECK error unless
  /// it is in [1, 2^31 - 1] (the growth tracker is an int32 tensor). Unlike
  /// Python, a growth tracker already at or past the new interval is set to
  /// `new_interval - 1` (on the device, no host read), so the next finite
  /// step grows the scale; Python's tracker would count past the interval
  /// and never grow it again.
  void set_growth_interval(int64_t new_interval);
  /// GradScalerOptions::enabled. A disabled scaler is Python's
  /// `enabled=False`: scale() returns its input, step() just steps the
  /// optimizer, unscale_() and update() do nothing.
  bool is_enabled() const { return options_.enabled(); }
  /// The options the scaler was made with.
  const GradScalerOptions& options() const { return options_; }

  /// Optimizer steps taken / skipped for non-finite gradients by step() and
  /// step_async(). Exact for both paths; after sync-free steps reading them
  /// syncs with the device (the counts are kept there, so a sync-free step
  /// captured in a CUDA graph counts once per replay, not at the capture).
  int64_t steps_taken() const;
  /// Optimizer steps skipped for non-finite gradients; see steps_taken().
  int64_t steps_skipped() const;
  /// Whether the last step() skipped the optimizer (a host read after a
  /// sync-free step).
  bool last_step_skipped() const;

  /// Names parameters for last_overflow(), for example with
  /// `model->named_parameters()` or with MasterWeights' masters paired with the
  /// model's names.
  void set_parameter_names(const std::vector<std::string>& names,
                           const std::vector<torch::Tensor>& params);
  /// With `diagnose_overflow`, the parameters whose gradients were non-finite
  /// in the latest unscale that found any (unnamed ones appear as
  /// "param_groups[g].params[i]").
  const std::vector<std::string>& last_overflow() const {
    return last_overflow_;
  }

  /// Reduces a found-inf flag across processes, in place: the flag is a
  /// one-element FP32 tensor on the gradients' device, 1 where an inf/NaN was
  /// found; after the call it must hold the maximum over all processes.
  using FoundInfReduction = std::function<void(torch::Tensor& found_inf)>;
  /// unscale_() passes each device's found-inf flag (in device order) to
  /// `reduce`, so that every process skips or steps together and the scale
  /// stays the same everywhere even where only one overflowed. nullptr (the
  /// default): no reduction. The scaler itself knows nothing of process
  /// groups: lamp::distributed::found_inf_reduction(group) makes the
  /// all-reduce (max) over a process group's ranks, and TrainStep sets its
  /// GradientSync's. Every process must then call unscale_/step for the same
  /// optimizers in the same order.
  void set_found_inf_reduction(FoundInfReduction reduce) {
    found_inf_reduction_ = std::move(reduce);
  }
  /// The reduction set_found_inf_reduction() installed (nullptr: none).
  const FoundInfReduction& found_inf_reduction() const {
    return found_inf_reduction_;
  }

  /// Saves the state into a torch::serialize archive (lamp's checkpoints)
  /// under Python's state-dict keys (`scale`,
  /// `growth_factor`, `backoff_factor`, `growth_interval`, `_growth_tracker`)
  /// plus lamp's own (`min_scale`, `max_scale`, `hysteresis`,
  /// `_overflow_count`, `dynamic`, `min_scale_patience`,
  /// `_min_scale_overflows`). A disabled scaler saves nothing, as
  /// Python's returns an empty dict. Python cannot read these archives: use
  /// save_state_dict() for a file that Python's `torch.load` reads.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Loads what save() wrote. Every field is checked first (its type; a
  /// scale that FP32 holds; the options' ranges; `_growth_tracker` in
  /// [0, 2^31), `_overflow_count` in [0, hysteresis]): a refused load
  /// leaves the scaler as it was. A `_growth_tracker` at or past
  /// `growth_interval` (Python's `set_growth_interval` lowered the interval
  /// after it counted) is taken as `growth_interval - 1`, with a warning, as
  /// set_growth_interval() clamps it. lamp's own keys are optional; a
  /// missing one keeps this scaler's option.
  void load(torch::serialize::InputArchive& archive);

  /// Python's `scaler.state_dict()`: the keys and types of
  /// `torch.amp.GradScaler` (`scale` float, `growth_factor` float,
  /// `backoff_factor` float, `growth_interval` int, `_growth_tracker` int);
  /// {} when disabled. lamp's own keys (as save() writes them) are added
  /// only when the scaler uses what Python's lacks: min_scale > 0, a finite
  /// max_scale, hysteresis > 1 or a pending overflow count, a static scale,
  /// or a min_scale_patience. Python's `load_state_dict` ignores them (and then behaves as
  /// Python's scaler); lamp's restores them.
  c10::Dict<std::string, c10::IValue> state_dict() const;
  /// Python's `scaler.load_state_dict(state)`: loads a state_dict() (or
  /// Python's), checked as load() does, all or nothing. A disabled scaler
  /// ignores it; an enabled one refuses an empty state (that of a disabled
  /// scaler), as Python does.
  void load_state_dict(const c10::Dict<std::string, c10::IValue>& state);

  /// Writes state_dict() in the format of Python's `torch.save`, atomically
  /// (save_pickle()), so that Python resumes from it:
  /// \code
  ///   scaler = torch.amp.GradScaler("cuda")
  ///   scaler.load_state_dict(torch.load("scaler.pt"))
  /// \endcode
  void save_state_dict(const std::string& path) const;
  /// Reads a file written by Python's `torch.save(scaler.state_dict(), path)`
  /// (or by save_state_dict()) and loads it as load_state_dict() does.
  /// An archive file of save() is not such a file (InputArchive reads it);
  /// the error says so.
  ///
  /// Example:
  /// \code
  ///   // Python: torch.save(scaler.state_dict(), "scaler.pt")
  ///   lamp::GradScaler scaler;
  ///   scaler.load_state_dict("scaler.pt");
  /// \endcode
  void load_state_dict(const std::string& path);

 private:
  // kChecked: the gradients were checked for inf/NaN but not unscaled (the
  // sync-free step unscales inside the optimizer).
  enum class Stage { kReady, kChecked, kUnscaled, kStepped };
  struct OptimizerState {
    Stage stage = Stage::kReady;
    std::map<std::string, torch::Tensor> found_inf_per_device;
  };

  void lazy_init(const torch::Device& device);
  void check_initialized(const char* caller) const;
  bool uses_fused_update() const;
  void record_overflow(torch::optim::Optimizer& optimizer);
  void check_and_unscale(torch::optim::Optimizer& optimizer, bool unscale);
  // The state under every key (with_lamp_keys) or Python's only.
  c10::Dict<std::string, c10::IValue> state(bool with_lamp_keys) const;
  // load()'s checks and assignment, from an archive or a dict
  // (detail::DictReader); defined and instantiated in grad_scaler.cpp.
  template <typename Source>
  void load_from(Source& source, const char* caller);

  GradScalerOptions options_;
  torch::Tensor scale_;               // FP32, 1 element
  torch::Tensor growth_tracker_;      // int32, 1 element
  torch::Tensor overflow_count_;      // int32, 1 element (hysteresis)
  torch::Tensor min_scale_overflows_; // int32, 1 element (min_scale_patience)
  double init_scale_;
  int64_t init_growth_tracker_ = 0;
  int64_t init_overflow_count_ = 0;
  int64_t init_min_scale_overflows_ = 0;
  std::unordered_map<const torch::optim::Optimizer*, OptimizerState> states_;
  using WeakTensorImpl =
      c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  std::unordered_map<const c10::TensorImpl*,
                     std::pair<WeakTensorImpl, std::string>>
      names_;
  std::vector<std::string> last_overflow_;
  FoundInfReduction found_inf_reduction_;
  // Counts of the synchronous path (host) and of the sync-free path (the
  // number of steps on the host, the skipped ones summed on the device).
  int64_t steps_taken_ = 0;
  int64_t steps_skipped_ = 0;
  // Sync-free steps run and skipped, counted by kernels on the device (which
  // a CUDA graph replays).
  torch::Tensor device_steps_;
  torch::Tensor device_skipped_;
  torch::Tensor last_found_inf_;
  // step() and update() run on one thread at a time.
  detail::InUseFlag in_use_;
};

/// `torch::save(scaler, path)` and `torch::load(scaler, path)`, and `archive
/// << scaler` / `archive >> scaler` in a checkpoint of your own: save() and
/// load().
inline torch::serialize::OutputArchive& operator<<(
    torch::serialize::OutputArchive& archive, const GradScaler& scaler) {
  scaler.save(archive);
  return archive;
}
/// Reads `scaler` from `archive` with GradScaler::load(): what
/// `torch::load(scaler, path)` calls.
inline torch::serialize::InputArchive& operator>>(
    torch::serialize::InputArchive& archive, GradScaler& scaler) {
  scaler.load(archive);
  return archive;
}

namespace detail {
/// The portable found-inf check and unscale: for every tensor, found_inf = 1
/// if it holds an inf/NaN, and tensor *= inv_scale (computed in FP32, as
/// ATen's kernel). Same contract as
/// `at::_amp_foreach_non_finite_check_and_unscale_`: found_inf and inv_scale
/// are one-element FP32 tensors on the tensors' device.
void non_finite_check_and_unscale_(std::vector<torch::Tensor>& tensors,
                                   torch::Tensor& found_inf,
                                   const torch::Tensor& inv_scale);
/// The portable scale update with lamp's bounds and hysteresis; with
/// min_scale 0, max_scale inf and hysteresis 1 it equals
/// `at::_amp_update_scale_` bit for bit. All arguments are 1-element device
/// tensors; nothing syncs with the host. With `min_scale_overflows` (an int32
/// tensor) and min_scale > 0, an overflowing step that meets the scale at
/// min_scale adds one to it, and a scale that ends above min_scale resets
/// it (GradScalerOptions::min_scale_patience).
void update_scale_(torch::Tensor& scale, torch::Tensor& growth_tracker,
                   torch::Tensor& overflow_count,
                   const torch::Tensor& found_inf, double growth_factor,
                   double backoff_factor, int64_t growth_interval,
                   double min_scale, double max_scale, int64_t hysteresis,
                   torch::Tensor* min_scale_overflows = nullptr);
} // namespace detail

} // namespace lamp
