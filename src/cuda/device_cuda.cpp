// Built only when the LibTorch found has CUDA: it includes CUDA headers.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <cuda.h>  // CUDA_VERSION
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include "lamp/backends.h"
#include "detail/cuda_name.h"
#include "detail/distributed_backend.h"  // with detail/compat.h

namespace lamp {

bool cuda_available() { return c10::cuda::device_count() > 0; }

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
c10::DeviceIndex cuda_index(const torch::Device& device) {
  return device.has_index() ? device.index() : c10::cuda::current_device();
}
} // namespace

int64_t peak_device_memory(const torch::Device& device) {
  if (!device.is_cuda() || !cuda_available()) {
    return 0;
  }
  detail::lazy_init_cuda();
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
    detail::lazy_init_cuda();
    c10::cuda::CUDACachingAllocator::resetPeakStats(cuda_index(device));
  }
}

} // namespace lamp

// NCCL: where this LibTorch was built with it and its header is found.
#if defined(USE_C10D_NCCL) && __has_include(<nccl.h>) && \
    __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define LAMP_HAVE_NCCL 1
#else
#define LAMP_HAVE_NCCL 0
#endif

namespace lamp {
namespace detail {

c10::intrusive_ptr<C10dBackend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    std::chrono::milliseconds timeout) {
#if LAMP_HAVE_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size,
                                                     options);
#else
  (void)store;
  (void)rank;
  (void)world_size;
  (void)timeout;
  TORCH_CHECK(false, "lamp::distributed: this lamp was built without NCCL "
              "(the LibTorch has no USE_C10D_NCCL, or nccl.h was not found). "
              "Rebuild lamp with NCCL's headers on the include path, or use "
              "backend gloo.");
#endif
}

} // namespace detail
} // namespace lamp
