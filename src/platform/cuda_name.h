#pragma once

#include <torch/types.h>

#include <string>
#include <utility>

namespace lamp {
namespace detail {
/// The CUDA device's name (src/platform/device_cuda.cpp); "no CUDA" in CPU-only
/// builds.
std::string cuda_device_name(const torch::Device& device);
/// The CUDA device's compute capability as {major, minor}; {0, 0} without a
/// usable GPU or in CPU-only builds.
std::pair<int, int> cuda_compute_capability(const torch::Device& device);
} // namespace detail
} // namespace lamp
