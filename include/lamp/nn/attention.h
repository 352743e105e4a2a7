#pragma once

/// \file
/// lamp::nn::scaled_dot_product_attention: one call for every LibTorch,
/// ATen's fused kernels where the LibTorch has them (2.0 on), the math
/// formula in 1.13.

#include <torch/types.h>

#include <string>
#include <vector>

namespace lamp {
namespace nn {

/// softmax(query key^T / sqrt(E) + mask) value over the last two
/// dimensions ([..., L, E] queries, [..., S, E] keys, [..., S, Ev] values),
/// as Python's torch.nn.functional.scaled_dot_product_attention:
/// `attn_mask` a boolean mask (true: attend) or an additive mask (FP32 or
/// the query's dtype) broadcastable to [..., L, S]; `is_causal` masks every
/// key after its query (with no attn_mask); `dropout_p` drops attention
/// weights (pass 0 in evaluation). The leading sizes (batch, heads) of
/// query, key and value must broadcast. On LibTorch 2.x this is ATen's op,
/// which picks a fused kernel (flash, memory-efficient, cuDNN) where one
/// applies; on 1.13 it is the math formula, the softmax in FP32 for 16-bit
/// inputs. Errors name mismatched shapes (the last two sizes, the leading
/// ones, a mask that does not broadcast), a mask of another dtype and a
/// causal call with a mask.
torch::Tensor scaled_dot_product_attention(const torch::Tensor& query,
                                           const torch::Tensor& key,
                                           const torch::Tensor& value,
                                           const torch::Tensor& attn_mask = {},
                                           double dropout_p = 0.0,
                                           bool is_causal = false);

/// The kernels behind scaled_dot_product_attention(), as Python's
/// torch.nn.attention.SDPBackend names them.
enum class SdpaBackend {
  kFlash,           ///< FlashAttention (CUDA, FP16/BF16).
  kMemoryEfficient, ///< xFormers' memory-efficient kernel (CUDA).
  kCuDNN,           ///< cuDNN's fused attention (CUDA; LibTorch 2.3 on).
  kMath,            ///< The unfused formula (every device).
};

/// "flash", "memory-efficient", "cudnn", "math".
std::string to_string(SdpaBackend backend);

/// The backend named by to_string(): "flash", "memory-efficient", "cudnn"
/// or "math". Errors name an unknown name and the four known ones.
SdpaBackend parse_sdpa_backend(const std::string& name);

/// The backends scaled_dot_product_attention() may use now (LibTorch's
/// process-wide switches); {kMath} on LibTorch 1.13.
std::vector<SdpaBackend> enabled_sdpa_backends();

/// Allows only `backends` for scaled_dot_product_attention() while it
/// lives, as Python's `torch.nn.attention.sdpa_kernel` does, and puts the
/// previous switches back when it ends (on exceptions too; guards nest).
/// The switches are LibTorch's, process-wide: every thread sees them.
/// Errors, before any switch changes, name an empty list and a backend this
/// LibTorch lacks (1.13 has only the math formula; cuDNN's needs 2.3).
///
/// Example:
/// \code
///   {
///     lamp::nn::SdpaBackendGuard only({lamp::nn::SdpaBackend::kMath});
///     auto reference = lamp::nn::scaled_dot_product_attention(q, k, v);
///   }  // the fused kernels are allowed again
/// \endcode
class SdpaBackendGuard {
 public:
  /// Enables `backends` and disables the others.
  explicit SdpaBackendGuard(const std::vector<SdpaBackend>& backends);
  /// Restores the switches found by the constructor.
  ~SdpaBackendGuard();
  SdpaBackendGuard(const SdpaBackendGuard&) = delete;
  SdpaBackendGuard& operator=(const SdpaBackendGuard&) = delete;

 private:
  std::vector<bool> previous_;
};

/// Whether scaled_dot_product_attention() runs ATen's op (LibTorch 2.x)
/// rather than lamp's math formula (1.13).
bool fused_attention_available();

} // namespace nn
} // namespace lamp
