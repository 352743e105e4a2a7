#pragma once

// lamp's one-pass FP8 cast (Float8Recipe::fused_casts) on tensors:
// src/nn/float8_cast_cuda.cpp where lamp is built with its CUDA kernels (a
// CUDA LibTorch and a CUDA compiler, CMakeLists.txt), else
// src/nn/float8_cast_cuda_none.cpp, which says why not.

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "nn/float8_internal.h"

namespace lamp {
namespace nn {
namespace internal {

/// "" when the fused cast takes `t` (CUDA, FP32, FP16 or BF16, at least one
/// element, in a lamp built with its CUDA kernels); otherwise why not.
std::string fused_cast_unavailable_reason(const torch::Tensor& t);

#if LAMP_TORCH_FLOAT8
/// cast_operand()'s cast and bookkeeping in one pass over `t` (two with
/// current scaling: its amax, then the cast), after
/// fused_cast_unavailable_reason() gave "": the same FP8 bits, scales and
/// counters as the ATen ops. `transpose` (a 2-D `t`): the cast pass also
/// writes Cast::transposed, the cast's transpose, tile by tile.
Cast fused_cast_operand(const torch::Tensor& t, const OperandState& s,
                        bool delayed, int64_t margin, torch::Dtype dtype,
                        bool transpose = false);
#endif

} // namespace internal
} // namespace nn
} // namespace lamp
