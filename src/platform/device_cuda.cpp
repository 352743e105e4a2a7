// Built only when the LibTorch found has CUDA: it includes CUDA headers.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda.h> // CUDA_VERSION

#include "lamp/platform/backends.h"
#include "lamp/platform/out_of_memory.h"
#include "platform/compat.h"
#include "platform/cuda_name.h"
#include "platform/memory.h"

namespace lamp {

bool cuda_available() {
  return c10::cuda::device_count() > 0;
}

std::string cuda_versions() {
  // CUDA_VERSION is the toolkit's (13000 for 13.0); cuDNN's runtime version
  // is major * 10000 + minor * 100 + patch from cuDNN 9 on (major * 1000 +
  // minor * 100 + patch before).
  std::string text = "CUDA " + std::to_string(CUDA_VERSION / 1000) + "." +
                     std::to_string(CUDA_VERSION % 1000 / 10);
  const auto& hooks = at::detail::getCUDAHooks();
  if (hooks.hasCuDNN()) {
    const long v = hooks.versionCuDNN();
    const long major = v >= 90000 ? v / 10000 : v / 1000;
    const long minor = v >= 90000 ? v / 100 % 100 : v / 100 % 10;
    text += ", cuDNN " + std::to_string(major) + "." + std::to_string(minor) +
            "." + std::to_string(v % 100);
  }
  return text;
}

namespace {
// The device's index, refused with lamp's words where this process sees no
// such GPU (ATen's property queries assert: "INTERNAL ASSERT FAILED").
c10::DeviceIndex cuda_index(const torch::Device& device) {
  if (!device.has_index()) {
    return c10::cuda::current_device();
  }
  const int count = c10::cuda::device_count();
  TORCH_CHECK(device.index() < count, "lamp: ", device,
              " does not exist: this process sees ", count, " CUDA device",
              count == 1 ? "" : "s", " (cuda:0 to cuda:", count - 1,
              "; CUDA_VISIBLE_DEVICES chooses which); give one of those.");
  return device.index();
}
} // namespace

namespace detail {
std::string cuda_device_name(const torch::Device& device) {
  if (!cuda_available()) {
    return "no CUDA GPU";
  }
  return at::cuda::getDeviceProperties(cuda_index(device))->name;
}

std::pair<int, int> cuda_compute_capability(const torch::Device& device) {
  if (!cuda_available()) {
    return {0, 0};
  }
  const auto* properties = at::cuda::getDeviceProperties(cuda_index(device));
  return {properties->major, properties->minor};
}
} // namespace detail

void synchronize(const torch::Device& device) {
  if (device.is_cuda() && cuda_available()) {
    c10::cuda::CUDAGuard guard(cuda_index(device));
    c10::cuda::device_synchronize();
  }
}

void reset_peak_device_memory(const torch::Device& device) {
  if (device.is_cuda() && cuda_available()) {
    detail::lazy_init_cuda();
    c10::cuda::CUDACachingAllocator::resetPeakStats(cuda_index(device));
  }
}

namespace {
// The caching allocator's statistics of `device`, or none without CUDA.
c10::optional<c10::cuda::CUDACachingAllocator::DeviceStats> allocator_stats(
    const torch::Device& device) {
  if (!device.is_cuda() || !cuda_available()) {
    return c10::nullopt;
  }
  detail::lazy_init_cuda();
  return c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_index(device));
}
} // namespace

int64_t peak_device_memory(const torch::Device& device) {
  const auto stats = allocator_stats(device);
  return stats ? stats->allocated_bytes[0].peak : 0;
}

int64_t allocated_device_memory(const torch::Device& device) {
  const auto stats = allocator_stats(device);
  return stats ? stats->allocated_bytes[0].current : 0;
}

int64_t reserved_device_memory(const torch::Device& device) {
  const auto stats = allocator_stats(device);
  return stats ? stats->reserved_bytes[0].current : 0;
}

void release_cached_device_memory() {
  if (cuda_available()) {
    detail::lazy_init_cuda();
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
}

uint64_t device_memory_bytes(const c10::Device& device) {
  if (device.is_cpu()) {
    return detail::cpu_memory_bytes();
  }
  if (!device.is_cuda() || !cuda_available()) {
    return 0;
  }
  detail::lazy_init_cuda();
  return at::cuda::getDeviceProperties(cuda_index(device))->totalGlobalMem;
}

} // namespace lamp
