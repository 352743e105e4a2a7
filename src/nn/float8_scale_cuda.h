#pragma once

// The end of a step of delayed scaling on lamp's CUDA kernel
// (Float8Recipe::fused_casts): src/nn/float8_scale_cuda.cpp where lamp is
// built with its CUDA kernels, else src/nn/float8_scale_cuda_none.cpp, which
// says why not.

#include <string>
#include <vector>

#include "lamp/nn/float8.h"

namespace lamp {
namespace nn {
namespace internal {

/// "" when the kernel takes `state`'s update (its tensors on CUDA, FP32 and
/// contiguous, a history it can shift, in a lamp built with its CUDA
/// kernels); otherwise why not.
std::string fused_scale_update_unavailable_reason(const Float8StateImpl& state);

/// update_float8_scales()'s update of each of `states` (delayed scaling, all
/// on one device, each accepted by fused_scale_update_unavailable_reason())
/// in one kernel launch per 64 layers: the same histories, scales and
/// pending amaxes, bit for bit, as the ATen ops.
void fused_update_scales(const std::vector<Float8StateImpl*>& states);

} // namespace internal
} // namespace nn
} // namespace lamp
