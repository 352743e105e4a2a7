// The CUDA queries of lamp/backends.h for a LibTorch built without CUDA.
#include "lamp/backends.h"

namespace lamp {

bool cuda_available() { return false; }

int64_t peak_device_memory(const torch::Device&) { return 0; }

void reset_peak_device_memory(const torch::Device&) {}

void synchronize(const torch::Device&) {}

} // namespace lamp
