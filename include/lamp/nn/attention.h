#pragma once

/// \file
/// lamp::nn::scaled_dot_product_attention: one call for every LibTorch,
/// ATen's fused kernels where the LibTorch has them (2.0 on), the math
/// formula in 1.13.

#include <torch/types.h>

namespace lamp {
namespace nn {

/// softmax(query key^T / sqrt(E) + mask) value over the last two
/// dimensions ([..., L, E] queries, [..., S, E] keys, [..., S, Ev] values),
/// as Python's torch.nn.functional.scaled_dot_product_attention:
/// `attn_mask` a boolean mask (true: attend) or an additive float mask
/// broadcastable to [..., L, S]; `is_causal` masks every key after its query
/// (with no attn_mask); `dropout_p` drops attention weights (pass 0 in
/// evaluation). On LibTorch 2.x this is ATen's op, which picks a fused
/// kernel (flash, memory-efficient, cuDNN) where one applies; on 1.13 it is
/// the math formula, the softmax in FP32 for 16-bit inputs. Errors name
/// mismatched shapes and a causal call with a mask.
torch::Tensor scaled_dot_product_attention(const torch::Tensor& query,
                                           const torch::Tensor& key,
                                           const torch::Tensor& value,
                                           const torch::Tensor& attn_mask = {},
                                           double dropout_p = 0.0,
                                           bool is_causal = false);

/// Whether scaled_dot_product_attention() runs ATen's op (LibTorch 2.x)
/// rather than lamp's math formula (1.13).
bool fused_attention_available();

} // namespace nn
} // namespace lamp
