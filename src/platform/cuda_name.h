#pragma once

#include <torch/types.h>

#include <string>

namespace lamp {
namespace detail {
/// The CUDA device's name (src/platform/device_cuda.cpp); "no CUDA" in CPU-only
/// builds.
std::string cuda_device_name(const torch::Device& device);
} // namespace detail
} // namespace lamp
