#pragma once

// The one place where lamp branches on the LibTorch version. Everything else
// calls these functions and constants.
//
// LibTorch 1.13 has per-device autocast functions (is_enabled/set_enabled for
// CUDA, is_cpu_enabled/set_cpu_enabled for CPU, get/set_autocast_{gpu,cpu}_dtype).
// LibTorch 2.4 replaced them with device-generic ones taking a DeviceType; the
// old names still compile there but warn.

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define LAMP_TORCH_DEVICE_GENERIC_AUTOCAST 1
#else
#define LAMP_TORCH_DEVICE_GENERIC_AUTOCAST 0
#endif

namespace lamp {
namespace detail {

/// CPU autocast accepts FP16 (LibTorch 1.13 only knows BF16 there).
constexpr bool kCpuAutocastSupportsHalf = LAMP_TORCH_DEVICE_GENERIC_AUTOCAST;

/// ATen has CPU kernels for _amp_foreach_non_finite_check_and_unscale_ and
/// _amp_update_scale_ (1.13 has them for CUDA only).
constexpr bool kCpuAmpKernels = LAMP_TORCH_DEVICE_GENERIC_AUTOCAST;

inline void check_autocast_device(c10::DeviceType device_type) {
  TORCH_CHECK(
      device_type == c10::DeviceType::CPU ||
          device_type == c10::DeviceType::CUDA,
      "lamp::Autocast: device type ", device_type,
      " is not supported; use torch::kCPU or torch::kCUDA.");
}

inline bool autocast_enabled(c10::DeviceType device_type) {
  check_autocast_device(device_type);
#if LAMP_TORCH_DEVICE_GENERIC_AUTOCAST
  return at::autocast::is_autocast_enabled(device_type);
#else
  return device_type == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled()
                                             : at::autocast::is_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType device_type, bool enabled) {
  check_autocast_device(device_type);
#if LAMP_TORCH_DEVICE_GENERIC_AUTOCAST
  at::autocast::set_autocast_enabled(device_type, enabled);
#else
  if (device_type == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
#endif
}

inline at::ScalarType autocast_dtype(c10::DeviceType device_type) {
  check_autocast_device(device_type);
#if LAMP_TORCH_DEVICE_GENERIC_AUTOCAST
  return at::autocast::get_autocast_dtype(device_type);
#else
  return device_type == c10::DeviceType::CPU
      ? at::autocast::get_autocast_cpu_dtype()
      : at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType device_type,
                               at::ScalarType dtype) {
  check_autocast_device(device_type);
#if LAMP_TORCH_DEVICE_GENERIC_AUTOCAST
  at::autocast::set_autocast_dtype(device_type, dtype);
#else
  if (device_type == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

} // namespace detail
} // namespace lamp

// c10d's backends are ProcessGroup subclasses in LibTorch 1.13 and Backend
// subclasses (under a ProcessGroup front) from 2.0; both have the allreduce /
// broadcast calls lamp uses. Only the distributed sources ask for this part.
#ifdef LAMP_COMPAT_C10D
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
namespace lamp {
namespace detail {
using C10dBackend = c10d::Backend;
} // namespace detail
} // namespace lamp
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
namespace lamp {
namespace detail {
using C10dBackend = c10d::ProcessGroup;
} // namespace detail
} // namespace lamp
#endif
#endif // LAMP_COMPAT_C10D
