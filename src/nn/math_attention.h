#pragma once

// lamp::nn's own attention formula, behind scaled_dot_product_attention
// where LibTorch has no fused attention (LibTorch 1.13). Declared here so
// that the tests can check it on any LibTorch.

#include <torch/torch.h>

namespace lamp::detail {

// softmax(q k^T / sqrt(E) + mask) v, as Python's math path computes it but
// for the products' dtype: q k^T and the weights times v are products in
// the inputs' dtype (16-bit under autocast, as autocast's matmul; Python's
// math path widens 16-bit inputs to FP32 for them), the scores scaled,
// masked and put through the softmax in FP32 (FP64 for FP64 inputs), a
// query whose keys are all masked given zero weights (as Python's
// _safe_softmax), the weights cast to the value's dtype, then dropped at
// dropout_p and the rest scaled by 1 / (1 - dropout_p). Runs in a
// RecordFunction scope named "lamp::math_attention". Checks nothing:
// scaled_dot_product_attention checks its arguments first.
torch::Tensor math_attention(const torch::Tensor& query,
                             const torch::Tensor& key,
                             const torch::Tensor& value,
                             const torch::Tensor& attn_mask, double dropout_p,
                             bool is_causal);

} // namespace lamp::detail
