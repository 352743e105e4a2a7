#pragma once

/// \file
/// The precision modes, with the spellings every lamp CLI uses.

#include <c10/util/Optional.h>
#include <torch/types.h>

#include <string>
#include <vector>

#include "lamp/platform/names.h"

namespace lamp {

/// How a training step runs.
enum class Precision {
  kFP32,    ///< "fp32": FP32 everywhere, TF32 off.
  kTF32,    ///< "tf32": FP32 with TF32 tensor-core math allowed (CUDA).
  kAMP,     ///< "amp": autocast FP16 + dynamic loss scaling.
  kAMPBF16, ///< "amp-bf16": autocast BF16, no loss scaling.
  kHalf,    ///< "half": network_to_half FP16 + FP32 master weights + dynamic
            ///< loss scaling (the seed's `--fp16`).
  kBF16,    ///< "bf16": network_to_half BF16 + FP32 master weights.
  kFP8,     ///< "fp8": "amp-bf16" with FP8 matrix products in the model's
            ///< eligible Linear layers (lamp::nn::convert_to_float8, current
            ///< scaling; TrainStepOptions::float8 picks another recipe).
            ///< Native on CUDA sm_89 and newer, emulated on CPUs with
            ///< LibTorch 2.x; refused on LibTorch 1.13.
  kAuto,    ///< "auto": the fastest mode of the device that keeps FP32's
            ///< accuracy (resolve_precision(), precision_support.h).
            ///< TrainStep and Trainer resolve it for the model's
            ///< device; checkpoints store the mode it resolved to.
};

/// The spellings of the precision modes: "fp32", "tf32", "amp", "amp-bf16",
/// "half" (alias "fp16"), "bf16", "fp8" and "auto". Parsing, printing, messages and the
/// programs' `--precision` check all read it.
const NameTable<Precision>& precision_table();

/// Parses "fp32", "tf32", "amp", "amp-bf16", "half", "bf16", "fp8", "auto", and
/// "fp16" as another spelling of "half". Anything else is a TORCH_CHECK error listing
/// the valid names.
Precision parse_precision(const std::string& name);

/// The canonical spelling ("amp-bf16", ...).
std::string to_string(Precision precision);

/// Every canonical spelling, in enum order ("auto" last).
const std::vector<std::string>& precision_names();

/// The modes a run can compute in: every mode but kAuto, in enum order.
const std::vector<Precision>& concrete_precisions();

/// The autocast dtype of the AMP modes; nullopt for the others.
c10::optional<torch::Dtype> autocast_dtype(Precision precision);

/// The dtype the model is converted to in the "half"/"bf16" modes; nullopt
/// for the others.
c10::optional<torch::Dtype> model_dtype(Precision precision);

/// Whether the mode keeps FP32 master weights ("half", "bf16").
bool uses_master_weights(Precision precision);

/// Whether the mode scales the loss ("amp", "half": FP16's narrow range needs
/// it; BF16 has FP32's range and does not).
bool uses_loss_scaling(Precision precision);

/// Whether the mode runs FP16 math ("amp", "half").
bool uses_fp16(Precision precision);

/// Everything a precision mode decides, computed once (precision_policy());
/// TrainStep, the trainer and the programs read it instead of deriving
/// each part from the mode again.
struct PrecisionPolicy {
  /// The mode this policy was computed for.
  Precision precision = Precision::kFP32;
  /// The dtype of the autocast region of the forward pass and evaluation
  /// ("amp": FP16, "amp-bf16": BF16); nullopt: no autocast.
  c10::optional<torch::Dtype> autocast_dtype;
  /// The dtype network_to_half converts the model (and TrainStep casts
  /// floating inputs) to ("half": FP16, "bf16": BF16); nullopt: unchanged.
  c10::optional<torch::Dtype> model_dtype;
  /// FP32 master weights behind a converted model ("half", "bf16").
  bool master_weights = false;
  /// Dynamic loss scaling ("amp", "half").
  bool loss_scaling = false;
  /// FP16 convolutions and matmuls ("amp", "half"), which LibTorch 1.13
  /// cannot run on a CPU.
  bool fp16_math = false;
  /// The TF32 setting the mode implies on CUDA ("fp32": off, "tf32": on);
  /// nullopt: the mode leaves it as it is.
  c10::optional<bool> tf32;
  /// FP8 matrix products in the eligible Linear layers ("fp8").
  bool float8 = false;
};

/// The policy of `precision`. kAuto has none until it is resolved for a
/// device (resolve_precision()): a TORCH_CHECK error says so.
PrecisionPolicy precision_policy(Precision precision);

} // namespace lamp
