#pragma once

// The weight-gradient product that also sums the bias gradient, for
// lamp::ops::linear_bgrad and gelu_mlp's second layer:
// src/ops/linear_bgrad_cuda.cpp where lamp is built with its CUDA kernels
// (cmake/LampCudaKernels.cmake), else src/ops/linear_bgrad_cuda_none.cpp,
// which says why not.

#include <torch/types.h>

#include <string>

namespace lamp {
namespace detail {

/// "" when cuBLASLt's BGRADB epilogue can take 16-bit CUDA operands of this
/// dtype and these sizes ([rows, in] input, [rows, out] gradient); otherwise
/// why not (lamp built without its CUDA kernels, the dtype, a width that is
/// not a multiple of 8, a size beyond cuBLASLt's 32-bit ones).
std::string linear_bgrad_unavailable_reason(at::ScalarType dtype, int64_t rows,
                                            int64_t in, int64_t out);

/// d_weight = grad^T input ([out, in]) and d_bias, grad's column sums
/// ([out]), from one cuBLASLt call (epilogue BGRADB): the bias gradient is
/// summed as the product reads grad, with no pass of its own. `grad`
/// [rows, out] and `input` [rows, in] contiguous, of one 16-bit dtype, on
/// the current device's stream. False, with `why` set and nothing written,
/// where cuBLASLt refuses (no algorithm for this shape or alignment): the
/// caller then runs the ATen ops.
bool linear_weight_bias_grad(const torch::Tensor& grad,
                             const torch::Tensor& input,
                             torch::Tensor& d_weight, torch::Tensor& d_bias,
                             std::string& why);

} // namespace detail
} // namespace lamp
