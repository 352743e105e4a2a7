#pragma once

/// \file
/// lamp::nn::linear: x W^T + b through ATen's linear op, for inputs of any
/// rank. LibTorch's C++ torch::nn::Linear (torch::nn::functional::linear)
/// runs an input of three or more dimensions as a matmul followed by
/// `output += bias`; under autocast that add meets a 16-bit product and the
/// FP32 bias, so it runs in FP32 through two full-size casts of the
/// activation. Python's nn.Linear calls ATen's op instead, which autocast
/// casts whole (the bias too) and which folds the bias into the matrix
/// product. On a GPT's blocks on the CPU in amp-bf16 the difference is
/// about a tenth of the step (docs/transformers.md).

#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include <string>

namespace lamp {
namespace nn {

/// y = input weight^T + bias over the last dimension of `input` ([..., in]
/// -> [..., out]), as Python's torch.nn.functional.linear: ATen's
/// at::linear, the op autocast casts as a whole. `bias` may be undefined.
/// Inside a lamp::nn::CastWeightsOnce that cast `weight` and `bias`, their
/// casts are used (lamp/nn/weight_cast.h). Errors name the input's and the
/// weight's shapes when they do not fit.
torch::Tensor linear(const torch::Tensor& input, const torch::Tensor& weight,
                     const torch::Tensor& bias = {});

/// `layer`'s weight and bias applied as linear(input, weight, bias): a
/// drop-in for `layer->forward(input)` with the same result in FP32 (to
/// rounding: the bias joins the product) and the same parameters. A layer
/// that lamp::nn::convert_to_float8() converted computes in FP8 instead
/// (lamp::nn::float8_linear(), lamp/nn/float8.h).
torch::Tensor linear(const torch::Tensor& input,
                     const torch::nn::Linear& layer);

namespace detail {

/// The checks of linear() and float8_linear(): an input [..., in], a weight
/// [out, in] and an undefined or [out] bias; errors begin with `who`.
void check_linear_arguments(const torch::Tensor& input,
                            const torch::Tensor& weight,
                            const torch::Tensor& bias, const std::string& who);

} // namespace detail

} // namespace nn
} // namespace lamp
