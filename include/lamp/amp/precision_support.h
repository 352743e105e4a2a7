#pragma once

/// \file
/// What each precision mode costs on a device: native, emulated (it runs,
/// slower than fp32) or unavailable, with the reason; the mode "auto"
/// resolves to; and the one-time warning for a mode that is slow or has no
/// effect where it runs.

#include <torch/types.h>

#include <string>
#include <vector>

#include "lamp/amp/precision.h"
#include "lamp/platform/hardware.h"

namespace lamp {

/// How a device runs a precision mode.
enum class SupportLevel {
  kNative,      ///< the hardware computes the mode's dtype
  kEmulated,    ///< it runs, but through conversions: slower than fp32
  kUnavailable, ///< this LibTorch cannot run it on the device
};

/// "native", "emulated" or "unavailable".
std::string to_string(SupportLevel level);

/// One mode on one device.
struct ModeSupport {
  /// The mode (never kAuto).
  Precision precision = Precision::kFP32;
  /// How the device runs it.
  SupportLevel level = SupportLevel::kNative;
  /// Why, in words: the hardware that makes it native, or what is missing
  /// ("the CPU has no AVX512-BF16 or AMX-BF16", "sm_61 has no FP16 tensor
  /// cores (sm_70 and later)").
  std::string reason;
  /// The mode computes exactly as fp32 does here: "tf32" where there is no
  /// TF32 (the CPU, GPUs before sm_80). Native, and no faster than fp32.
  bool same_as_fp32 = false;
  /// What it costs against fp32 where it is emulated, as measured
  /// (docs/precision-modes.md): "measured 16x slower than fp32 (MNIST CNN, AVX2
  /// AMD EPYC)"; empty where nothing was measured.
  std::string cost;
};

/// Every mode on one device, and what "auto" picks there.
///
/// \code
///   const auto support = lamp::precision_support(torch::kCPU);
///   std::cout << support.to_string();            // the table
///   if (support.of(lamp::Precision::kAMPBF16).level ==
///       lamp::SupportLevel::kEmulated) { ... }   // BF16 would be slow here
///   auto mode = support.automatic;               // what kAuto resolves to
/// \endcode
struct PrecisionSupport {
  /// The facts the table was derived from.
  DeviceCapabilities device;
  /// One entry per concrete mode (concrete_precisions()), in enum order.
  std::vector<ModeSupport> modes;
  /// What Precision::kAuto resolves to on this device: never kAuto, never a
  /// mode that is emulated or unavailable, save where every mode is
  /// unavailable (a CUDA device without a usable GPU): there it is kFP32,
  /// so that "auto" resolves, and automatic_reason says that nothing runs
  /// (the run then fails on the device, as with any mode).
  Precision automatic = Precision::kFP32;
  /// Why "auto" chose it ("the CPU has AVX512-BF16: autocast BF16 ...").
  std::string automatic_reason;

  /// The entry of `precision` (kAuto: the entry of `automatic`). Throws
  /// where `modes` has no entry for it (a table filled by hand).
  const ModeSupport& of(Precision precision) const&;
  /// The same entry, copied, from a table that is a temporary
  /// (`precision_support(device).of(p)`): a reference into it would dangle
  /// at the end of the statement.
  ModeSupport of(Precision precision) &&;
  /// The device and one line per mode, as the programs' --precision-support
  /// prints it; the last line is "auto: MODE (why)".
  std::string to_string() const;
};

/// The support table of `device`, from device_capabilities(device).
PrecisionSupport precision_support(const torch::Device& device);

/// The support table for given facts: the whole decision, testable without
/// the hardware.
///
/// CPU: fp32 native; tf32 the same as fp32 (TF32 is a GPU format);
/// amp-bf16 and bf16 native with AVX512-BF16 or AMX-BF16, else emulated;
/// half unavailable where the LibTorch has no FP16 CPU kernels (1.13), amp
/// unavailable there and where its CPU autocast takes no FP16 (before
/// LibTorch 2.4: lamp::Autocast::is_supported(torch::kCPU, torch::kHalf));
/// otherwise both native with AVX512-FP16 or AMX-FP16, else emulated.
/// CUDA: nothing without a GPU (compute capability 0.0), fp32 included;
/// fp32 native; tf32 native from sm_80, the same as fp32 before; amp and
/// half native from sm_70, emulated before; amp-bf16 and bf16 native from
/// sm_80, emulated before. "auto": amp-bf16 where BF16 is native (CPU with
/// BF16 hardware, sm_80 and later), amp on sm_70 to sm_75, fp32 elsewhere
/// (also without a GPU, where nothing runs).
PrecisionSupport precision_support(const DeviceCapabilities& device);

/// The same table, with whether the LibTorch's CPU autocast takes FP16
/// given instead of asked of the LibTorch lamp was built with: "amp" on a
/// CPU needs it besides the FP16 kernels (DeviceCapabilities::fp16_kernels),
/// "half" only the kernels. Other devices ignore it.
PrecisionSupport precision_support(const DeviceCapabilities& device,
                                   bool cpu_fp16_autocast);

/// `precision`, with kAuto replaced by what it resolves to on `device`;
/// other modes are returned as they are.
Precision resolve_precision(Precision precision, const torch::Device& device);

/// The warning for running `precision` on the device of `support`: what it
/// costs and what to use instead where the mode is emulated, or that it has
/// no effect where it computes as fp32; "" where there is nothing to say
/// (native modes, unavailable ones: those are errors, not warnings).
std::string precision_warning(Precision precision,
                              const PrecisionSupport& support);

/// Emits precision_warning() through TORCH_WARN, once per process for each
/// mode and device type. TrainStep calls it; a lamp::WarningSink
/// (platform/warnings.h) sends the warnings where the caller wants them.
/// Returns whether it warned now.
bool warn_precision_once(Precision precision, const torch::Device& device);

/// A suggestion of modes for messages, with the cost said where a mode is
/// emulated: "amp-bf16 or bf16" where BF16 is native on `device`,
/// "fp32 (amp-bf16 and bf16 run here, but emulated: ...)" where it is not.
std::string suggest_low_precision(const torch::Device& device);

} // namespace lamp
