#pragma once

// The element loads and stores of lamp's CUDA kernels (src/*/*.cu): FP32,
// FP16 and BF16 values read as FP32, and FP32 values rounded to nearest
// even into each, as ATen's conversions round. CUDA sources only.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace lamp {
namespace detail {
namespace cuda {

__device__ __forceinline__ float load(const float* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float load(const __half* p, int64_t i) {
  return __half2float(p[i]);
}
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

template <typename T>
__device__ __forceinline__ T round_to(float v);
template <>
__device__ __forceinline__ float round_to<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half round_to<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 round_to<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

} // namespace cuda
} // namespace detail
} // namespace lamp
