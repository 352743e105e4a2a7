#pragma once

/// \file
/// The precision modes, with the spellings every lamp CLI uses.

#include <c10/util/Optional.h>
#include <torch/types.h>

#include <string>
#include <vector>

namespace lamp {

/// How a training step runs.
enum class Precision {
  kFP32,     ///< "fp32": FP32 everywhere, TF32 off.
  kTF32,     ///< "tf32": FP32 with TF32 tensor-core math allowed (CUDA).
  kAMP,      ///< "amp": autocast FP16 + dynamic loss scaling.
  kAMPBF16,  ///< "amp-bf16": autocast BF16, no loss scaling.
  kHalf,     ///< "half": network_to_half FP16 + FP32 master weights + dynamic
             ///< loss scaling (the seed's `--fp16`).
  kBF16,     ///< "bf16": network_to_half BF16 + FP32 master weights.
};

/// Parses "fp32", "tf32", "amp", "amp-bf16", "half", "bf16", and "fp16" as
/// another spelling of "half". Anything else is a TORCH_CHECK error listing
/// the valid names.
Precision parse_precision(const std::string& name);

/// The canonical spelling ("amp-bf16", ...).
std::string to_string(Precision precision);

/// Every canonical spelling, in enum order.
const std::vector<std::string>& precision_names();

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

} // namespace lamp
