#include "lamp/amp/precision.h"

#include <c10/util/Exception.h>

namespace lamp {

const NameTable<Precision>& precision_table() {
  static const NameTable<Precision> table("precision", "precisions",
                                          {{"fp32", Precision::kFP32},
                                           {"tf32", Precision::kTF32},
                                           {"amp", Precision::kAMP},
                                           {"amp-bf16", Precision::kAMPBF16},
                                           {"half", Precision::kHalf},
                                           {"fp16", Precision::kHalf},
                                           {"bf16", Precision::kBF16},
                                           {"fp8", Precision::kFP8},
                                           {"auto", Precision::kAuto}});
  return table;
}

const std::vector<std::string>& precision_names() {
  return precision_table().names();
}

const std::vector<Precision>& concrete_precisions() {
  static const std::vector<Precision> modes = {
      Precision::kFP32, Precision::kTF32, Precision::kAMP, Precision::kAMPBF16,
      Precision::kHalf, Precision::kBF16, Precision::kFP8};
  return modes;
}

Precision parse_precision(const std::string& name) {
  return precision_table().parse(name);
}

std::string to_string(Precision precision) {
  return precision_table().name(precision);
}

c10::optional<torch::Dtype> autocast_dtype(Precision precision) {
  switch (precision) {
    case Precision::kAMP:
      return torch::kHalf;
    case Precision::kAMPBF16:
    case Precision::kFP8: // BF16 around the FP8 products
      return torch::kBFloat16;
    default:
      return c10::nullopt;
  }
}

c10::optional<torch::Dtype> model_dtype(Precision precision) {
  switch (precision) {
    case Precision::kHalf:
      return torch::kHalf;
    case Precision::kBF16:
      return torch::kBFloat16;
    default:
      return c10::nullopt;
  }
}

bool uses_master_weights(Precision precision) {
  return model_dtype(precision).has_value();
}

bool uses_loss_scaling(Precision precision) {
  return uses_fp16(precision);
}

bool uses_fp16(Precision precision) {
  return precision == Precision::kAMP || precision == Precision::kHalf;
}

PrecisionPolicy precision_policy(Precision precision) {
  TORCH_CHECK(
      precision != Precision::kAuto,
      "lamp: precision 'auto' has no policy until it is resolved for a device; call lamp::resolve_precision(Precision::kAuto, device) first (TrainStep and Trainer do this themselves).");
  PrecisionPolicy policy;
  policy.precision = precision;
  policy.autocast_dtype = autocast_dtype(precision);
  policy.model_dtype = model_dtype(precision);
  policy.master_weights = uses_master_weights(precision);
  policy.loss_scaling = uses_loss_scaling(precision);
  policy.fp16_math = uses_fp16(precision);
  if (precision == Precision::kFP32 || precision == Precision::kTF32) {
    policy.tf32 = precision == Precision::kTF32;
  }
  policy.float8 = precision == Precision::kFP8;
  return policy;
}

} // namespace lamp
