// Built only when the LibTorch found has CUDA: it includes CUDA headers.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include "lamp/backends.h"
#include "detail/cuda_name.h"

namespace lamp {

bool cuda_available() { return c10::cuda::device_count() > 0; }

namespace {
c10::DeviceIndex cuda_index(const torch::Device& device) {
  return device.has_index() ? device.index() : c10::cuda::current_device();
}
} // namespace

int64_t peak_device_memory(const torch::Device& device) {
  if (!device.is_cuda() || !cuda_available()) {
    return 0;
  }
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_index(device));
  return stats.allocated_bytes[0].peak;
}

namespace detail {
std::string cuda_device_name(const torch::Device& device) {
  if (!cuda_available()) {
    return "no CUDA GPU";
  }
  return at::cuda::getDeviceProperties(cuda_index(device))->name;
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
    c10::cuda::CUDACachingAllocator::resetPeakStats(cuda_index(device));
  }
}

} // namespace lamp
