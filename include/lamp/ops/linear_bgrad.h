#pragma once

/// \file
/// A linear layer whose backward takes the bias's gradient from the
/// weight-gradient product. ATen's linear backward runs two matrix products
/// and then a reduction of the output's gradient for the bias, one more
/// pass over it and one more kernel per layer; on CUDA, where lamp was
/// built with its CUDA kernels, linear_bgrad() has cuBLASLt sum the bias
/// gradient as the weight-gradient product reads the same gradient
/// (epilogue BGRADB), as Apex's fused_dense and Transformer Engine do.
/// Elsewhere the same products run as ATen ops.

#include <torch/types.h>

#include <string>

namespace lamp {
namespace ops {

/// `torch::linear(x, weight, bias)` over x's last dimension ([..., in] ->
/// [..., out]), with the bias gradient summed in the weight-gradient
/// product's epilogue (see the file's comment).
///
/// - `x`: floating point [..., in] with at least one row; `weight` [out,
///   in]; `bias` [out] or undefined (then nothing is fused: it runs
///   torch::linear). All on x's device.
/// - The product runs in autocast's dtype where autocast is on for the
///   device (as autocast runs linear), else in x's dtype (the weight and
///   bias cast to it). The output has that dtype; the gradients come in
///   each input's own dtype.
/// - Off the fused path the arithmetic is torch::linear's and its
///   backward's, op for op: the same bits. The fused path sums the bias
///   gradient in another order, in FP32, rounded once to the product's
///   16-bit dtype: within a unit in the last place or so of ATen's sum.
///
/// Throws c10::Error, naming the argument and the fix, on shapes that do
/// not fit, no rows, tensors that are not floating point, or tensors on
/// other devices than x.
///
/// Example (lamp's GPT with GPTOptions::fused_bias_grad):
/// \code
///   auto qkv = lamp::ops::linear_bgrad(normed, c_attn->weight, c_attn->bias);
/// \endcode
///
/// \warning Differentiable once: a backward with create_graph=true stops
/// with an error naming torch::linear, which gives second derivatives.
torch::Tensor linear_bgrad(const torch::Tensor& x, const torch::Tensor& weight,
                           const torch::Tensor& bias);

/// Which code linear_bgrad() runs for these arguments: "cuBLASLt epilogue",
/// or "ATen ops" followed by why (no bias; not a CUDA tensor; lamp built
/// without its CUDA kernels; a dtype or size the epilogue does not take).
/// On CUDA with a bias, linear_bgrad() gives that reason once as a warning
/// and runs the ATen ops; so it does where cuBLASLt finds no algorithm.
std::string linear_bgrad_path(const torch::Tensor& x,
                              const torch::Tensor& weight,
                              const torch::Tensor& bias);

} // namespace ops
} // namespace lamp
