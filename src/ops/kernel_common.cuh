#pragma once

// What lamp's kernels share (src/ops/*.cu, CUDA sources only): the C++ type
// of a kernels::Dtype, and the deterministic sums of per-block partial rows.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ops/add_norm_kernels.h" // kernels::Dtype

namespace lamp {
namespace detail {
namespace kernels {

/// Calls f with a value of the C++ type of `dtype`.
template <typename F>
void with_type(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::kFloat:
      f(float{});
      break;
    case Dtype::kHalf:
      f(__half{});
      break;
    case Dtype::kBFloat16:
      f(__nv_bfloat16{});
      break;
  }
}

// Internal to each kernel source that includes this: a kernel of external
// linkage defined in two sources would register one host stub for two
// device modules.
namespace {

/// out[c] = the sum of partial[b * width + c] over the blocks b, in block
/// order: each kernel block wrote its row, and the sums come out the same
/// from run to run (no atomics).
template <typename T>
__global__ void column_sum_kernel(const T* partial, T* out, int64_t blocks,
                                  int64_t width) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= width) {
    return;
  }
  T acc = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    acc += partial[b * width + c];
  }
  out[c] = acc;
}

} // namespace

} // namespace kernels
} // namespace detail
} // namespace lamp
