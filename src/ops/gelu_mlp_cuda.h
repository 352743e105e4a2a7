#pragma once

// lamp::ops::gelu_mlp's cuBLASLt products: src/ops/gelu_mlp_cuda.cpp where
// lamp is built with its CUDA kernels (a CUDA LibTorch and a CUDA
// compiler, cmake/LampCudaKernels.cmake), else src/ops/gelu_mlp_cuda_none.cpp,
// which says why not.

#include <torch/types.h>

#include <string>

namespace lamp {
namespace detail {

/// "" when the epilogues can take 16-bit CUDA operands of this dtype and
/// these sizes ([rows, in] x, [hidden, in] and [out, hidden] weights);
/// otherwise why not (lamp built without them, the dtype, a size that is
/// not a multiple of 8, too large for cuBLASLt's 32-bit sizes).
std::string gelu_mlp_epilogue_unavailable_reason(at::ScalarType dtype,
                                                 int64_t rows, int64_t in,
                                                 int64_t hidden, int64_t out);

/// pre = x fc_weight^T + fc_bias and h = gelu_tanh(pre), both [rows,
/// hidden], from one cuBLASLt call (epilogue GELU_AUX_BIAS, or GELU_AUX
/// without a bias). Operands contiguous, of one 16-bit dtype. False, with
/// `why` set and nothing written, where cuBLASLt refuses (no algorithm for
/// this shape or alignment): the caller then runs the ATen ops.
bool gelu_mlp_fc_forward(const torch::Tensor& x, const torch::Tensor& fc_weight,
                         const torch::Tensor& fc_bias, torch::Tensor& pre,
                         torch::Tensor& h, std::string& why);

/// d_pre = (grad proj_weight) * gelu_tanh'(pre), [rows, hidden], and, where
/// `want_bias`, its column sums (the fc bias's gradient, [hidden]) from one
/// cuBLASLt call (epilogue DGELU_BGRAD, or DGELU). False as above.
bool gelu_mlp_proj_backward(const torch::Tensor& grad,
                            const torch::Tensor& proj_weight,
                            const torch::Tensor& pre, bool want_bias,
                            torch::Tensor& d_pre, torch::Tensor& d_fc_bias,
                            std::string& why);

} // namespace detail
} // namespace lamp
