#include "lamp/amp/precision.h"

#include <c10/util/Exception.h>

namespace lamp {

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> names = {"fp32",     "tf32", "amp",
                                                 "amp-bf16", "half", "bf16"};
  return names;
}

Precision parse_precision(const std::string& name) {
  const auto& names = precision_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (name == names[i]) {
      return static_cast<Precision>(i);
    }
  }
  if (name == "fp16") {
    return Precision::kHalf;
  }
  TORCH_CHECK(false, "lamp: unknown precision '", name,
              "'; valid precisions are fp32, tf32, amp, amp-bf16, half (or "
              "fp16) and bf16.");
}

std::string to_string(Precision precision) {
  return precision_names().at(static_cast<size_t>(precision));
}

c10::optional<torch::Dtype> autocast_dtype(Precision precision) {
  switch (precision) {
    case Precision::kAMP:
      return torch::kHalf;
    case Precision::kAMPBF16:
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
  return policy;
}

} // namespace lamp
