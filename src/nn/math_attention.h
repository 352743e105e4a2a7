#pragma once

// lamp::nn's own attention formula, behind scaled_dot_product_attention
// where LibTorch has no fused attention (LibTorch 1.13). Declared here so
// that the tests can check it on any LibTorch.

#include <torch/torch.h>

namespace lamp::detail {

// softmax(q k^T / sqrt(E) + mask) v, as Python's math path computes it: the
// scores and softmax in FP32 (FP64 for FP64 inputs), the weights cast to the
// value's dtype, then dropped at dropout_p and the rest scaled by
// 1 / (1 - dropout_p). Runs in a RecordFunction scope named
// "lamp::math_attention". Checks nothing: scaled_dot_product_attention
// checks its arguments first.
torch::Tensor math_attention(const torch::Tensor& query,
                             const torch::Tensor& key,
                             const torch::Tensor& value,
                             const torch::Tensor& attn_mask, double dropout_p,
                             bool is_causal);

} // namespace lamp::detail
