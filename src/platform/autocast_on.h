#pragma once

// Whether autocast is on for a tensor's device, asked where any device may
// come: lamp's fused ops and layers follow autocast as ATen's ops do.

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

} // namespace detail
} // namespace lamp
