// The residual add and LayerNorm/RMSNorm kernels (src/ops/add_norm_kernels.h).
//
// Forward: one block a row. It reads x and the branch once, writes their sum
// rounded to its type and sums it (or its squares) in FP32; a second sweep
// over the row it just wrote (in L1/L2: a row is a few KiB) takes the
// variance about the mean, as two passes do in FP32 without Welford's
// divisions; a third writes y. Backward: `blocks` blocks step over the rows;
// each row's two sums (of g = dy * weight and of g * xhat) give
//   LayerNorm: ds = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dsum
//   RMSNorm:   ds = rstd * (g - xhat * mean(g * xhat)) + dsum
// written to the gradients of x and of the branch in one sweep, while each
// thread adds dy * xhat and dy to its block's row of partial sums for the
// weight and the bias: a second kernel adds the blocks' rows in a fixed
// order, so the gradients are the same from run to run (no atomics).
#include "ops/add_norm_kernels.h"

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

// The sum of v over the block, returned to every thread. `shared` holds 32
// floats; blockDim.x is a multiple of 32.
__device__ float block_sum(float v, float* shared) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  __syncthreads(); // the previous call's readers are done with shared
  if (lane == 0) {
    shared[warp] = v;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = static_cast<int>(blockDim.x >> 5);
    v = lane < warps ? shared[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) {
      v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    if (lane == 0) {
      shared[0] = v;
    }
  }
  __syncthreads();
  return shared[0];
}

template <typename TS, typename TB, typename TY>
__global__ void forward_kernel(const TS* x, const TB* branch,
                               const float* weight, const float* bias, TS* sum,
                               TY* normed, float* mean, float* rstd,
                               int64_t width, float eps, bool rms) {
  __shared__ float shared[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * width;
  const float n = static_cast<float>(width);
  float acc = 0.0f;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
    const TS s = round_to<TS>(load(x, base + c) + load(branch, base + c));
    sum[base + c] = s;
    const float v = load(&s, 0);
    acc += rms ? v * v : v;
  }
  const float total = block_sum(acc, shared);
  float mu = 0.0f;
  float inv = 0.0f;
  if (rms) {
    inv = rsqrtf(total / n + eps);
  } else {
    mu = total / n;
    float squares = 0.0f;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
      const float d = load(sum, base + c) - mu;
      squares += d * d;
    }
    inv = rsqrtf(block_sum(squares, shared) / n + eps);
  }
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
    float v = (load(sum, base + c) - mu) * inv;
    if (weight != nullptr) {
      v *= weight[c];
    }
    if (bias != nullptr) {
      v += bias[c];
    }
    normed[base + c] = round_to<TY>(v);
  }
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = mu;
    rstd[blockIdx.x] = inv;
  }
}

template <typename TS, typename TB, typename TY>
__global__ void backward_kernel(const TY* grad_normed, const TS* grad_sum,
                                const TS* sum, const float* weight,
                                const float* mean, const float* rstd,
                                TS* grad_x, TB* grad_branch,
                                float* partial_weight, float* partial_bias,
                                int64_t rows, int64_t width, bool rms) {
  __shared__ float shared[32];
  const float n = static_cast<float>(width);
  const int64_t partial = static_cast<int64_t>(blockIdx.x) * width;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * width;
    const float mu = mean[row];
    const float inv = rstd[row];
    float sum_g = 0.0f;
    float sum_gx = 0.0f;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
      const float xhat = (load(sum, base + c) - mu) * inv;
      const float dy =
          grad_normed != nullptr ? load(grad_normed, base + c) : 0.0f;
      const float g = weight != nullptr ? dy * weight[c] : dy;
      sum_g += g;
      sum_gx += g * xhat;
      if (partial_weight != nullptr) {
        partial_weight[partial + c] += dy * xhat;
      }
      if (partial_bias != nullptr) {
        partial_bias[partial + c] += dy;
      }
    }
    const float mean_g = rms ? 0.0f : block_sum(sum_g, shared) / n;
    const float mean_gx = block_sum(sum_gx, shared) / n;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
      const float xhat = (load(sum, base + c) - mu) * inv;
      const float dy =
          grad_normed != nullptr ? load(grad_normed, base + c) : 0.0f;
      const float g = weight != nullptr ? dy * weight[c] : dy;
      float ds = inv * (g - mean_g - xhat * mean_gx);
      if (grad_sum != nullptr) {
        ds += load(grad_sum, base + c);
      }
      grad_x[base + c] = round_to<TS>(ds);
      grad_branch[base + c] = round_to<TB>(ds);
    }
  }
}

// Calls f with values of the C++ types of the sum's, the branch's and the
// output's dtypes (27 instantiations).
template <typename F>
void with_types(Dtype sum, Dtype branch, Dtype normed, F&& f) {
  with_type(sum, [&](auto s) {
    with_type(branch,
              [&](auto b) { with_type(normed, [&](auto y) { f(s, b, y); }); });
  });
}

// Threads a row: about four elements each, whole warps, 32 to 512.
unsigned threads_for(int64_t width) {
  const int64_t wanted = (width + 3) / 4;
  const int64_t warps = (wanted + 31) / 32;
  return static_cast<unsigned>(warps < 1 ? 32 : warps > 16 ? 512 : warps * 32);
}

} // namespace

cudaError_t add_norm_forward(const AddNormForwardArgs& a, cudaStream_t stream) {
  const unsigned threads = threads_for(a.width);
  const dim3 grid(static_cast<unsigned>(a.rows));
  with_types(
      a.sum_dtype, a.branch_dtype, a.normed_dtype, [&](auto s, auto b, auto y) {
        using TS = decltype(s);
        using TB = decltype(b);
        using TY = decltype(y);
        forward_kernel<TS, TB, TY><<<grid, threads, 0, stream>>>(
            static_cast<const TS*>(a.x), static_cast<const TB*>(a.branch),
            a.weight, a.bias, static_cast<TS*>(a.sum),
            static_cast<TY*>(a.normed), a.mean, a.rstd, a.width, a.eps, a.rms);
      });
  return cudaGetLastError();
}

cudaError_t add_norm_backward(const AddNormBackwardArgs& a,
                              cudaStream_t stream) {
  const unsigned threads = threads_for(a.width);
  with_types(
      a.sum_dtype, a.branch_dtype, a.normed_dtype, [&](auto s, auto b, auto y) {
        using TS = decltype(s);
        using TB = decltype(b);
        using TY = decltype(y);
        backward_kernel<TS, TB, TY>
            <<<static_cast<unsigned>(a.blocks), threads, 0, stream>>>(
                static_cast<const TY*>(a.grad_normed),
                static_cast<const TS*>(a.grad_sum),
                static_cast<const TS*>(a.sum), a.weight, a.mean, a.rstd,
                static_cast<TS*>(a.grad_x), static_cast<TB*>(a.grad_branch),
                a.partial_weight, a.partial_bias, a.rows, a.width, a.rms);
      });
  cudaError_t error = cudaGetLastError();
  const unsigned column_threads = 256;
  const dim3 columns(
      static_cast<unsigned>((a.width + column_threads - 1) / column_threads));
  if (error == cudaSuccess && a.grad_weight != nullptr) {
    column_sum_kernel<float><<<columns, column_threads, 0, stream>>>(
        a.partial_weight, a.grad_weight, a.blocks, a.width);
    error = cudaGetLastError();
  }
  if (error == cudaSuccess && a.grad_bias != nullptr) {
    column_sum_kernel<float><<<columns, column_threads, 0, stream>>>(
        a.partial_bias, a.grad_bias, a.blocks, a.width);
    error = cudaGetLastError();
  }
  return error;
}

} // namespace kernels
} // namespace detail
} // namespace lamp
