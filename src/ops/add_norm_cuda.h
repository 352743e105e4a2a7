#pragma once

// lamp::ops::add_layer_norm's and add_rms_norm's CUDA kernels on tensors:
// src/ops/add_norm_cuda.cpp where lamp is built with its CUDA kernels (a
// CUDA LibTorch and a CUDA compiler, CMakeLists.txt), else
// src/ops/add_norm_cuda_none.cpp, which says why not.

#include <torch/types.h>

#include <string>

namespace lamp {
namespace detail {

/// "" when the kernels can take CUDA tensors `x`, `branch` whose sum has
/// dtype `sum`, normalised to `normed`, over `rows` rows; otherwise why not
/// (lamp built without them, a dtype they do not take, too many rows).
std::string add_norm_kernel_unavailable_reason(at::ScalarType sum,
                                               at::ScalarType branch,
                                               at::ScalarType normed,
                                               int64_t rows);

/// What the forward gives and the backward keeps: the sum and the output,
/// [rows, width], and each row's mean and 1/std (FP32 [rows]).
struct AddNormKernelForward {
  torch::Tensor sum, normed, mean, rstd;
};

/// The forward on the kernel, after add_norm_kernel_unavailable_reason gave
/// "". x and branch [rows, width] (x cast to the sum's dtype here); weight
/// and bias FP32 [width] or undefined.
AddNormKernelForward add_norm_kernel_forward(
    const torch::Tensor& x, const torch::Tensor& branch,
    const torch::Tensor& weight, const torch::Tensor& bias, double eps,
    bool rms, at::ScalarType sum_dtype, at::ScalarType normed_dtype);

/// The gradients of x (in the sum's dtype), of branch (in `branch_dtype`)
/// and, where wanted, of weight and bias (FP32).
struct AddNormKernelBackward {
  torch::Tensor x, branch, weight, bias;
};

/// The backward on the kernel. grad_normed, grad_sum: [rows, width] or
/// undefined (no gradient from that output); sum, mean, rstd: the forward's.
AddNormKernelBackward add_norm_kernel_backward(
    const torch::Tensor& grad_normed, const torch::Tensor& grad_sum,
    const torch::Tensor& sum, const torch::Tensor& mean,
    const torch::Tensor& rstd, const torch::Tensor& weight, bool rms,
    bool want_weight, bool want_bias, at::ScalarType branch_dtype);

} // namespace detail
} // namespace lamp
