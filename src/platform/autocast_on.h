#pragma once

// Whether autocast is on for a tensor's device, asked where any device may
// come: lamp's fused ops and layers follow autocast as ATen's ops do.

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>

#include "platform/compat.h"

namespace lamp {
namespace detail {

/// Whether autocast is on for `device_type`: false on the devices lamp's
/// autocast does not know (all but the CPU and CUDA), for which
/// autocast_enabled() throws.
inline bool autocast_on(c10::DeviceType device_type) {
  return (device_type == c10::DeviceType::CPU ||
          device_type == c10::DeviceType::CUDA) &&
         autocast_enabled(device_type);
}

/// The dtype autocast runs a linear of `x` in: autocast's where it is on
/// for x's device and x has a dtype it casts (FP32, BF16, FP16), else x's
/// own. The fused ops that stand for linears compute in it.
inline at::ScalarType linear_compute_dtype(const at::Tensor& x) {
  const auto device_type = x.device().type();
  const auto dtype = x.scalar_type();
  if (autocast_on(device_type) &&
      (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf)) {
    return autocast_dtype(device_type);
  }
  return dtype;
}

} // namespace detail
} // namespace lamp
