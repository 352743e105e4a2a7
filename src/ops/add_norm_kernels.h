#pragma once

// The CUDA kernels of lamp::ops::add_layer_norm and add_rms_norm
// (src/ops/add_norm_kernels.cu), behind an interface of plain pointers so
// that the CUDA source includes no LibTorch header: src/ops/add_norm_cuda.cpp
// checks and allocates the tensors and calls these on the current stream.
// Every tensor is contiguous, [rows, width] or [width] or [rows].

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lamp {
namespace detail {
namespace kernels {

/// The element types the kernels take.
enum class Dtype { kFloat, kHalf, kBFloat16 };

/// s = x + branch (rounded to s's type), y = norm(s) * weight + bias, and
/// each row's mean (0 for RMSNorm) and 1 / sqrt(variance or mean square +
/// eps), in FP32.
struct AddNormForwardArgs {
  const void* x = nullptr;       // [rows, width], sum_dtype
  const void* branch = nullptr;  // [rows, width], branch_dtype
  const float* weight = nullptr; // [width] or null (ones)
  const float* bias = nullptr;   // [width] or null (zeros)
  void* sum = nullptr;           // [rows, width], sum_dtype
  void* normed = nullptr;        // [rows, width], normed_dtype
  float* mean = nullptr;         // [rows]
  float* rstd = nullptr;         // [rows]
  int64_t rows = 0;
  int64_t width = 0;
  float eps = 1e-5f;
  bool rms = false;
  Dtype sum_dtype = Dtype::kFloat;
  Dtype branch_dtype = Dtype::kFloat;
  Dtype normed_dtype = Dtype::kFloat;
};

/// Launches the forward on `stream`; returns the launch's error.
cudaError_t add_norm_forward(const AddNormForwardArgs& args,
                             cudaStream_t stream);

/// The gradients of x and branch (both ds = norm's backward of dy plus the
/// sum's own gradient) and of weight and bias (FP32 sums over the rows: each
/// of `blocks` blocks writes its partial sums, a second kernel adds them).
struct AddNormBackwardArgs {
  const void* grad_normed = nullptr; // [rows, width], normed_dtype, or null
  const void* grad_sum = nullptr;    // [rows, width], sum_dtype, or null
  const void* sum = nullptr;         // [rows, width], sum_dtype
  const float* weight = nullptr;     // [width] or null (ones)
  const float* mean = nullptr;       // [rows]
  const float* rstd = nullptr;       // [rows]
  void* grad_x = nullptr;            // [rows, width], sum_dtype
  void* grad_branch = nullptr;       // [rows, width], branch_dtype
  float* partial_weight = nullptr;   // [blocks, width], zeroed, or null
  float* partial_bias = nullptr;     // [blocks, width], zeroed, or null
  float* grad_weight = nullptr;      // [width] or null
  float* grad_bias = nullptr;        // [width] or null
  int64_t rows = 0;
  int64_t width = 0;
  int blocks = 1;
  bool rms = false;
  Dtype sum_dtype = Dtype::kFloat;
  Dtype branch_dtype = Dtype::kFloat;
  Dtype normed_dtype = Dtype::kFloat;
};

/// Launches the backward on `stream`; returns the first launch error.
cudaError_t add_norm_backward(const AddNormBackwardArgs& args,
                              cudaStream_t stream);

/// The backward's blocks for `rows` rows: enough to fill the device a few
/// times over (4 a multiprocessor), at most a row each, at least one.
inline int64_t add_norm_backward_blocks(int64_t rows, int64_t multiprocessors) {
  const int64_t most = 4 * multiprocessors;
  const int64_t blocks = rows < most ? rows : most;
  return blocks > 1 ? blocks : 1;
}

} // namespace kernels
} // namespace detail
} // namespace lamp
