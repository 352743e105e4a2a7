// The CUDA queries of lamp/backends.h for a LibTorch built without CUDA.
#include "lamp/backends.h"
#include "detail/cuda_name.h"

namespace lamp {

bool cuda_available() { return false; }

int64_t peak_device_memory(const torch::Device&) { return 0; }

void reset_peak_device_memory(const torch::Device&) {}

void synchronize(const torch::Device&) {}

namespace detail {
std::string cuda_device_name(const torch::Device&) { return "no CUDA"; }
} // namespace detail

} // namespace lamp
