// The conv level's per-channel elementwise kernel
// (src/ops/channel_affine_kernels.h): one pass over NHWC tensors where the
// ATen ops it replaces make one pass per operation (a cast to FP32, a
// multiply, an add, a ReLU and a cast back each read and write the whole
// tensor). A thread takes V consecutive values of one pixel (V channels),
// with 16-byte loads where the layout allows, and strides over the rest.
#include "ops/channel_affine_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ops/kernel_common.cuh"
#include "platform/cuda_elements.cuh"

namespace lamp {
namespace detail {
namespace kernels {
namespace {

using lamp::detail::cuda::load;
using lamp::detail::cuda::round_to;

// V values of T read or written at once: 16 bytes for the vectorized
// kernel, one value otherwise.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T, int V>
__device__ __forceinline__ void load_pack(const void* p, int64_t i,
                                          float (&out)[V]) {
  const auto pack =
      *reinterpret_cast<const Pack<T, V>*>(static_cast<const T*>(p) + i);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    out[k] = load(pack.v, k);
  }
}

template <typename T, int V>
__global__ void channel_affine_kernel(ChannelAffineArgs a) {
  const int64_t n = a.rows * a.channels;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x * V;
  for (int64_t i =
           (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
       i < n; i += step) {
    float u[V], gate[V], v[V];
    if (a.u != nullptr) {
      load_pack<T, V>(a.u, i, u);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        u[k] = 0.0f;
      }
    }
    if (a.gate != nullptr) {
      load_pack<T, V>(a.gate, i, gate);
    }
    if (a.v != nullptr) {
      load_pack<T, V>(a.v, i, v);
    }
    // V divides the channels (or is 1): the V values share a pixel.
    const int64_t c0 = i % a.channels;
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t c = c0 + k;
      float t = u[k];
      if (a.gate != nullptr && !(gate[k] > 0.0f)) {
        t = 0.0f;
      }
      // __fmul_rn / __fadd_rn: never contracted into a fused multiply-add,
      // so each step rounds as the ATen op it replaces does.
      if (a.u_scale != nullptr) {
        t = __fmul_rn(t, a.u_scale[c]);
      }
      if (a.u_shift != nullptr) {
        t = __fadd_rn(t, a.u_shift[c]);
      }
      if (a.v != nullptr) {
        float w = v[k];
        if (a.v_scale != nullptr) {
          w = __fmul_rn(w, a.v_scale[c]);
        }
        if (a.v_shift != nullptr) {
          w = __fadd_rn(w, a.v_shift[c]);
        }
        t = __fadd_rn(t, w);
      }
      if (a.relu && !isnan(t)) {
        t = fmaxf(t, 0.0f); // NaN stays NaN, as ATen's clamp keeps it
      }
      out.v[k] = round_to<T>(t);
    }
    *reinterpret_cast<Pack<T, V>*>(static_cast<T*>(a.out) + i) = out;
  }
}

template <typename T>
void launch(const ChannelAffineArgs& a, cudaStream_t stream) {
  constexpr unsigned threads = 256;
  constexpr int kVector = 16 / sizeof(T);
  const int v = a.vectorized ? kVector : 1;
  const int64_t per_block = static_cast<int64_t>(threads) * v;
  const int64_t needed = (a.rows * a.channels + per_block - 1) / per_block;
  const unsigned blocks = static_cast<unsigned>(
      needed < a.max_blocks ? (needed > 0 ? needed : 1) : a.max_blocks);
  if (a.vectorized) {
    channel_affine_kernel<T, kVector><<<blocks, threads, 0, stream>>>(a);
  } else {
    channel_affine_kernel<T, 1><<<blocks, threads, 0, stream>>>(a);
  }
}

// Block b sums rows [b per, (b + 1) per) of its threads' channels (thread
// t: channels t, t + blockDim.x, ...; a warp reads consecutive channels of
// a row).
template <typename T>
__global__ void gated_sums_kernel(GatedSumsArgs a) {
  const int64_t per = (a.rows + gridDim.x - 1) / gridDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * per;
  const int64_t last = first + per < a.rows ? first + per : a.rows;
  const auto* u = static_cast<const T*>(a.u);
  const auto* gate = static_cast<const T*>(a.gate);
  const auto* x = static_cast<const T*>(a.a);
  const auto* y = static_cast<const T*>(a.b);
  for (int64_t c = threadIdx.x; c < a.channels; c += blockDim.x) {
    float sum = 0.0f, sum_a = 0.0f, sum_b = 0.0f;
    for (int64_t r = first; r < last; ++r) {
      const int64_t i = r * a.channels + c;
      float g = load(u, i);
      if (gate != nullptr && !(load(gate, i) > 0.0f)) {
        g = 0.0f;
      }
      sum += g;
      if (x != nullptr) {
        sum_a = fmaf(g, load(x, i), sum_a);
      }
      if (y != nullptr) {
        sum_b = fmaf(g, load(y, i), sum_b);
      }
    }
    // This block's row of partial: its three sums, channels apart.
    float* row = a.partial + static_cast<int64_t>(blockIdx.x) * 3 * a.channels;
    row[c] = sum;
    row[a.channels + c] = sum_a;
    row[2 * a.channels + c] = sum_b;
  }
}

template <typename T>
void launch_sums(const GatedSumsArgs& a, cudaStream_t stream) {
  // One warp per 32 channels, up to 256 threads.
  const int64_t warps = (a.channels + 31) / 32;
  const unsigned threads = static_cast<unsigned>(warps < 8 ? warps * 32 : 256);
  gated_sums_kernel<T>
      <<<static_cast<unsigned>(a.blocks), threads, 0, stream>>>(a);
}

} // namespace

cudaError_t gated_sums(const GatedSumsArgs& a, cudaStream_t stream) {
  with_type(a.dtype, [&](auto t) { launch_sums<decltype(t)>(a, stream); });
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    return error;
  }
  constexpr unsigned threads = 256;
  const auto blocks =
      static_cast<unsigned>((3 * a.channels + threads - 1) / threads);
  column_sum_kernel<float><<<blocks, threads, 0, stream>>>(
      a.partial, a.sums, a.blocks, 3 * a.channels);
  return cudaGetLastError();
}

cudaError_t channel_affine(const ChannelAffineArgs& a, cudaStream_t stream) {
  with_type(a.dtype, [&](auto t) { launch<decltype(t)>(a, stream); });
  return cudaGetLastError();
}

} // namespace kernels
} // namespace detail
} // namespace lamp
