// The end of a step of delayed scaling for many FP8 layers in one kernel
// (src/nn/float8_scale_kernels.h): one block per layer and operand, instead
// of about ten ATen kernels per layer (roll, copies, the history's max, the
// reciprocal, two products, where, zero).
//
// The arithmetic is update_float8_scales()'s ATen ops': the maximum is exact
// (a NaN wins, as in ATen's max), the reciprocal an IEEE FP32 division, and
// the factor max / 2^m the double quotient rounded to FP32 once, as ATen
// rounds a double scalar multiplying an FP32 tensor; so the bits agree.
#include "nn/float8_scale_kernels.h"

#include <cfloat>

#include "platform/cuda_reduce.cuh"

namespace lamp {
namespace nn {
namespace kernels {
namespace {

constexpr int kThreads = 256;
// The columns of FP32 in dynamic shared memory beside block_reduce's static
// partials (36 bytes; 256 kept): a block may take 48 KiB in all without
// opting in to more, so 12,224 columns, not 12,288 (a history that long
// would fail to launch).
constexpr int kStaticSharedBytes = 256;
constexpr int kMaxHistory =
    static_cast<int>((48 * 1024 - kStaticSharedBytes) / sizeof(float));
static_assert((kThreads / 32 + 1) * sizeof(float) <= kStaticSharedBytes,
              "block_reduce's partials fit beside the history");
static_assert(sizeof(Float8ScaleArgs) <= 4096,
              "a kernel's parameters take at most 4 KiB");

// The larger of two floats, a NaN winning (as ATen's max).
struct NanMaxOp {
  __device__ float operator()(float a, float b) const {
    return (a > b || isnan(a)) ? a : b;
  }
};

// Block (layer, operand).
__global__ void update_scales_kernel(Float8ScaleArgs args) {
  extern __shared__ float old_row[];
  const Float8ScaleLayer& layer = args.layers[blockIdx.x];
  const int operand = blockIdx.y;
  const int len = layer.history_len;
  float* row = layer.history + static_cast<int64_t>(operand) * len;
  const float pending = layer.pending[operand];
  for (int i = threadIdx.x; i < len; i += blockDim.x) {
    old_row[i] = row[i];
  }
  __syncthreads();
  // The history one column older, the pending amax the newest; its max.
  float amax = -INFINITY;
  for (int i = threadIdx.x; i < len; i += blockDim.x) {
    const float v = i == 0 ? pending : old_row[i - 1];
    row[i] = v;
    amax = NanMaxOp{}(amax, v);
  }
  amax = layer.history_max ? lamp::detail::cuda::block_reduce<kThreads>(
                                 amax, -INFINITY, NanMaxOp{})
                           : pending;
  if (threadIdx.x == 0) {
    // At most the largest finite float, as the ATen ops clamp it (a tiny
    // amax would give an inf scale).
    const float fresh =
        fminf((1.0f / amax) * layer.max_over_margin[operand], FLT_MAX);
    if (amax > 0.0f) {
      layer.scale[operand] = fresh;
    }
    layer.pending[operand] = 0.0f;
  }
}

} // namespace

int float8_scale_update_max_history() {
  return kMaxHistory;
}

cudaError_t float8_update_scales(const Float8ScaleArgs& args,
                                 cudaStream_t stream) {
  if (args.count == 0) {
    return cudaSuccess;
  }
  int longest = 1;
  for (int i = 0; i < args.count; ++i) {
    longest = args.layers[i].history_len > longest ? args.layers[i].history_len
                                                   : longest;
  }
  const dim3 grid(static_cast<unsigned>(args.count), 3);
  update_scales_kernel<<<grid, kThreads, longest * sizeof(float), stream>>>(
      args);
  return cudaGetLastError();
}

} // namespace kernels
} // namespace nn
} // namespace lamp
