#pragma once

// A block-wide reduction for lamp's CUDA kernels (src/*/*.cu): warp
// shuffles, then the warps' results through shared memory. CUDA sources
// only.

namespace lamp {
namespace detail {
namespace cuda {

/// `op` over `v` of the kThreads threads of the block (blockDim.x ==
/// kThreads, a multiple of 32), returned to every thread. Every thread of
/// the block must call it; `identity` is op's neutral value.
template <int kThreads, typename T, typename Op>
__device__ T block_reduce(T v, T identity, Op op) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024,
                "whole warps, at most 1024 threads");
  __shared__ T partial[kThreads / 32];
  __shared__ T result;
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) {
    partial[warp] = v;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? partial[lane] : identity;
    for (int offset = 16; offset > 0; offset >>= 1) {
      v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    if (lane == 0) {
      result = v;
    }
  }
  __syncthreads();
  return result;
}

} // namespace cuda
} // namespace detail
} // namespace lamp
