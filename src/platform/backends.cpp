#include "lamp/platform/backends.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <ATen/Context.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <sys/resource.h>

#include <fstream>
#include <map>
#include <mutex>
#include <utility>

#include "platform/cuda_name.h"

namespace lamp {

void set_cudnn_benchmark(bool enabled) {
  at::globalContext().setBenchmarkCuDNN(enabled);
}

bool cudnn_benchmark() {
  return at::globalContext().benchmarkCuDNN();
}

void set_cudnn_benchmark_limit(int limit) {
  TORCH_CHECK(
      limit >= 0,
      "lamp::set_cudnn_benchmark_limit: the limit must be >= 0 (0 tries every algorithm), got ",
      limit, ".");
  at::globalContext().setBenchmarkLimitCuDNN(limit);
}

int cudnn_benchmark_limit() {
  return at::globalContext().benchmarkLimitCuDNN();
}

void set_tf32(bool enabled) {
  at::globalContext().setAllowTF32CuDNN(enabled);
  at::globalContext().setAllowTF32CuBLAS(enabled);
}

Tf32Guard::Tf32Guard(bool enabled)
    : cudnn_(at::globalContext().allowTF32CuDNN()),
      cublas_(at::globalContext().allowTF32CuBLAS()) {
  set_tf32(enabled);
}

Tf32Guard::~Tf32Guard() {
  at::globalContext().setAllowTF32CuDNN(cudnn_);
  at::globalContext().setAllowTF32CuBLAS(cublas_);
}

bool tf32() {
  return at::globalContext().allowTF32CuDNN() &&
         at::globalContext().allowTF32CuBLAS();
}

namespace {

bool probe_cpu_fp16_compute() {
  torch::NoGradGuard no_grad;
  // Autocast would recast the probe's FP16 inputs to BF16 and hide the answer:
  // the probe runs with autocast's dispatch keys excluded (what disabling
  // autocast does, in every LibTorch).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  try {
    const auto options = torch::TensorOptions().dtype(torch::kHalf);
    torch::conv2d(torch::ones({1, 1, 3, 3}, options),
                  torch::ones({1, 1, 2, 2}, options));
    torch::linear(torch::ones({2, 2}, options), torch::ones({2, 2}, options));
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

// Runs LayerNorm and GroupNorm on tiny `dtype` inputs with FP32 parameters
// on `device`. The kernels refuse the mix on the host (a dtype check before
// any launch), so the answer needs no synchronization.
bool probe_mixed_dtype_norm(const torch::Device& device, torch::Dtype dtype) {
  torch::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  try {
    const auto fp32 = torch::TensorOptions().device(device);
    const auto x = torch::ones({2, 4}, fp32.dtype(dtype));
    torch::layer_norm(x, {4}, torch::ones({4}, fp32), torch::zeros({4}, fp32));
    torch::group_norm(x, 2, torch::ones({4}, fp32), torch::zeros({4}, fp32));
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

} // namespace

bool mixed_dtype_norm_available(const torch::Device& device,
                                torch::Dtype dtype) {
  if (!(device.is_cpu() || device.is_cuda()) ||
      !(dtype == torch::kHalf || dtype == torch::kBFloat16)) {
    return false;
  }
  // Once per device type and dtype: the kernels are one build's, whichever
  // GPU runs them. ATen's CUDA LayerNorm and GroupNorm (through 2.15) read
  // their parameters in the input's dtype and refuse FP32 ones; 2.x's CPU
  // kernels take them, 1.13's do not.
  static std::mutex mutex;
  static std::map<std::pair<bool, torch::Dtype>, bool> answers;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device.is_cuda(), dtype);
  const auto found = answers.find(key);
  if (found != answers.end()) {
    return found->second;
  }
  const bool available = probe_mixed_dtype_norm(device, dtype);
  answers.emplace(key, available);
  return available;
}

std::string libtorch_version() {
  // LAMP_TORCH_PACKAGE: the Debian package and version CMake found holding
  // this LibTorch (cmake/LampTorchInfo.cmake), or "".
  const std::string package = LAMP_TORCH_PACKAGE;
  if (package.empty()) {
    return TORCH_VERSION;
  }
  return std::string(TORCH_VERSION) + " (Debian package " + package + ")";
}

std::string device_name(const torch::Device& device) {
  if (device.is_cuda()) {
    return detail::cuda_device_name(device);
  }
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) {
        return line.substr(colon + 2);
      }
    }
  }
  return "cpu";
}

int64_t peak_host_memory() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) {
    return 0;
  }
  return static_cast<int64_t>(usage.ru_maxrss) * 1024; // Linux: kilobytes
}

bool fp16_compute_available(const torch::Device& device) {
  if (device.is_cuda()) {
    return cuda_available();
  }
  if (device.is_cpu()) {
    static const bool available = probe_cpu_fp16_compute();
    return available;
  }
  return false;
}

} // namespace lamp
