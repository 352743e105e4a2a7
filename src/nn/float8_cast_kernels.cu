// The one-pass FP8 casts (src/nn/float8_cast_kernels.h).
//
// max |x| is reduced on the bits of |x| (the sign bit cleared) as unsigned
// integers: for IEEE floats that order is the order of the values, and a NaN
// (exponent all ones, a non-zero mantissa) is above infinity, so a NaN
// anywhere gives a NaN amax, as ATen's aminmax does. Each block writes its
// maximum; the last block to finish (a counter after a fence, as CUB's
// single-pass reductions do) takes the maximum of those and updates the
// layer's state in one thread, in the order and the FP32 arithmetic of
// internal::cast_operand's ATen ops, so the two give the same bits.
#include "nn/float8_cast_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "platform/cuda_elements.cuh"
#include "platform/cuda_reduce.cuh"

namespace lamp {
namespace nn {
namespace kernels {
namespace {

constexpr int kThreads = 256;
// torchao's floor under an amax (float8_cast.cpp's kAmaxFloor).
constexpr float kAmaxFloor = 1e-12f;

using lamp::detail::cuda::load;

__device__ __forceinline__ unsigned magnitude_bits(float v) {
  return __float_as_uint(v) & 0x7fffffffu;
}

// The maximum of unsigned integers (the bits of |x|).
struct MaxOp {
  __device__ unsigned operator()(unsigned a, unsigned b) const {
    return max(a, b);
  }
};

// The maximum of v over the block.
__device__ unsigned block_max(unsigned v) {
  return lamp::detail::cuda::block_reduce<kThreads>(v, 0u, MaxOp{});
}

// x * scale in FP8, rounded to nearest even: clamped to +-max first (a NaN
// stays NaN, as with ATen's clamp_, and an infinite x becomes NaN, as
// detail::cast_to_float8 makes it), or converted as ATen converts (out of
// range: NaN in E4M3, infinity in E5M2).
__device__ __forceinline__ __nv_fp8_storage_t to_fp8(float x, float scale,
                                                     float max,
                                                     Float8Format format,
                                                     bool saturate) {
  float v = x * scale;
  if (saturate) {
    v = isinf(x) ? __int_as_float(0x7fffffff) : v;
    if (!isnan(v)) {
      v = fminf(fmaxf(v, -max), max);
    }
  }
  return __nv_cvt_float_to_fp8(
      v, saturate ? __NV_SATFINITE : __NV_NOSAT,
      format == Float8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2);
}

// Thread 0 of the last block to finish: the amax of every block, then the
// state's updates (internal::cast_operand's, in its order).
__device__ void finish(const Float8CastArgs& a, unsigned block_amax) {
  __shared__ bool last;
  if (threadIdx.x == 0) {
    a.partial_amax[blockIdx.x] = block_amax;
    __threadfence();
    last = atomicAdd(a.blocks_done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last || threadIdx.x != 0) {
    return;
  }
  __threadfence();
  unsigned bits = 0;
  for (int b = 0; b < a.blocks; ++b) {
    bits = max(bits, static_cast<volatile unsigned*>(a.partial_amax)[b]);
  }
  const float amax = __uint_as_float(bits);
  const bool finite = isfinite(amax);
  *a.non_finite += finite ? 0.0f : 1.0f;
  float scale;
  if (a.delayed) {
    scale = *a.scale;
    if (finite) {
      *a.pending_amax = fmaxf(*a.pending_amax, amax);
    }
    *a.saturated += finite && amax * scale > a.saturated_above ? 1.0f : 0.0f;
  } else {
    // clamp_min keeps a NaN; fmaxf would drop it.
    scale = a.max_over_margin / (isnan(amax) ? amax : fmaxf(amax, kAmaxFloor));
    *a.cast_scale = scale;
  }
  *a.last_scale = scale;
  *a.casts += 1.0f;
  *a.inverse_scale = 1.0f / scale;
}

// Delayed scaling: cast with the state's scale and reduce max |x| in one
// pass; current scaling (cast = false): only the reduction.
template <typename T>
__global__ void amax_kernel(Float8CastArgs a, bool cast) {
  const T* x = static_cast<const T*>(a.input);
  auto* out = static_cast<__nv_fp8_storage_t*>(a.output);
  const float scale = cast ? *a.scale : 0.0f;
  unsigned bits = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < a.numel; i += stride) {
    const float v = load(x, i);
    bits = max(bits, magnitude_bits(v));
    if (cast) {
      out[i] = to_fp8(v, scale, a.max, a.format, /*saturate=*/true);
    }
  }
  finish(a, block_max(bits));
}

// Current scaling's cast, with the scale the reduction computed.
template <typename T>
__global__ void cast_kernel(Float8CastArgs a) {
  const T* x = static_cast<const T*>(a.input);
  auto* out = static_cast<__nv_fp8_storage_t*>(a.output);
  const float scale = *a.cast_scale;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < a.numel; i += stride) {
    out[i] = to_fp8(load(x, i), scale, a.max, a.format, /*saturate=*/false);
  }
}

// The cast of a row-major [rows, cols] matrix and its transpose, tile by
// tile: a warp reads a tile's row (consecutive elements), writes the FP8
// values to `output` and to a tile in shared memory, then writes the tile's
// columns as rows of `transposed` (consecutive bytes again). Delayed scaling
// (reduce = true): with the state's scale, clamped, and max |x| reduced and
// the state updated, as amax_kernel does; current scaling: with the scale
// amax_kernel computed, unclamped, as cast_kernel does.
constexpr int kTile = 32;
constexpr int kTileRows = kThreads / kTile; // 8 rows of threads
static_assert(kThreads % kTile == 0, "a block is whole rows of a tile");

template <typename T>
__global__ void cast_transpose_kernel(Float8CastArgs a, bool reduce) {
  const T* x = static_cast<const T*>(a.input);
  auto* out = static_cast<__nv_fp8_storage_t*>(a.output);
  auto* out_t = static_cast<__nv_fp8_storage_t*>(a.transposed);
  const float scale = reduce ? *a.scale : *a.cast_scale;
  // 36 bytes a row: reading a column, the 32 threads of a warp meet 32
  // different banks (36 / 4 = 9 words apart, 9 prime to 32).
  __shared__ __nv_fp8_storage_t tile[kTile][kTile + 4];
  const int tx = threadIdx.x % kTile;
  const int ty = threadIdx.x / kTile;
  const int64_t tile_cols = (a.cols + kTile - 1) / kTile;
  const int64_t tiles = (a.rows + kTile - 1) / kTile * tile_cols;
  unsigned bits = 0;
  for (int64_t i = blockIdx.x; i < tiles; i += gridDim.x) {
    const int64_t r0 = i / tile_cols * kTile;
    const int64_t c0 = i % tile_cols * kTile;
    for (int j = ty; j < kTile; j += kTileRows) {
      const int64_t r = r0 + j, c = c0 + tx;
      if (r < a.rows && c < a.cols) {
        const float v = load(x, r * a.cols + c);
        if (reduce) {
          bits = max(bits, magnitude_bits(v));
        }
        const auto q = to_fp8(v, scale, a.max, a.format, /*saturate=*/reduce);
        out[r * a.cols + c] = q;
        tile[j][tx] = q;
      }
    }
    __syncthreads();
    for (int j = ty; j < kTile; j += kTileRows) {
      const int64_t c = c0 + j, r = r0 + tx;
      if (c < a.cols && r < a.rows) {
        out_t[c * a.rows + r] = tile[tx][j];
      }
    }
    __syncthreads(); // the next tile overwrites this one
  }
  if (reduce) {
    finish(a, block_max(bits));
  }
}

template <typename T>
cudaError_t launch(const Float8CastArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.blocks));
  const bool transpose = a.transposed != nullptr;
  if (transpose && a.delayed) {
    cast_transpose_kernel<T><<<grid, kThreads, 0, stream>>>(a, true);
    return cudaGetLastError();
  }
  amax_kernel<T><<<grid, kThreads, 0, stream>>>(a, a.delayed);
  cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess && !a.delayed) {
    if (transpose) {
      cast_transpose_kernel<T><<<grid, kThreads, 0, stream>>>(a, false);
    } else {
      cast_kernel<T><<<grid, kThreads, 0, stream>>>(a);
    }
    error = cudaGetLastError();
  }
  return error;
}

} // namespace

cudaError_t float8_cast(const Float8CastArgs& args, cudaStream_t stream) {
  switch (args.source) {
    case Float8Source::kHalf:
      return launch<__half>(args, stream);
    case Float8Source::kBFloat16:
      return launch<__nv_bfloat16>(args, stream);
    case Float8Source::kFloat:
      break;
  }
  return launch<float>(args, stream);
}

} // namespace kernels
} // namespace nn
} // namespace lamp
