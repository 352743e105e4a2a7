#pragma once

/// \file
/// Did it really run in half precision? A per-tensor dtype report.

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace lamp {

/// One parameter or buffer of a module tree.
struct TensorPrecision {
  std::string name; ///< qualified name, like "layer1.0.bn1.weight"
  std::string
      module; ///< the owning module's type, like "torch::nn::BatchNorm2dImpl"
  /// A buffer (BatchNorm's running statistics, ...) rather than a parameter.
  bool is_buffer = false;
  /// The tensor's dtype.
  torch::Dtype dtype = torch::kFloat;
  /// Number of elements.
  int64_t numel = 0;
  /// A floating-point tensor left in FP32 in a tree that also holds FP16/BF16
  /// tensors (what network_to_half keeps, BatchNorm by default).
  bool kept_fp32 = false;
  /// Why a kept_fp32 tensor is FP32: "a norm" (BatchNorm, InstanceNorm,
  /// LayerNorm, GroupNorm, lamp::nn::RMSNorm: network_to_half and autocast
  /// keep their statistics and parameters in FP32), or "chosen" (a
  /// HalfOptions::keep_fp32 predicate or the model's own cast); "" for
  /// tensors not kept.
  std::string kept_fp32_reason;
  /// The weight of a torch::nn::Linear whose products run in FP8
  /// (lamp::nn::convert_to_float8: E4M3 forward, E5M2 gradients). The
  /// weight itself stays in its dtype (the FP32 master).
  bool float8 = false;
  /// The weight of a torch::nn::Linear left out of FP8 in a model with FP8
  /// layers: why (lamp::nn::float8_left_out()); its products stay in the
  /// autocast dtype. "" for every other tensor.
  std::string not_float8_reason;
};

/// Every parameter and buffer of a module tree with its dtype.
struct PrecisionReport {
  /// Module by module, depth first from the root (the order of
  /// named_children()); in each module its parameters, then its buffers. A
  /// tensor registered under several names (a tied weight) is listed once,
  /// under the first.
  std::vector<TensorPrecision> tensors;
  /// Elements per dtype name ("Float", "BFloat16", "Long", ...).
  std::map<std::string, int64_t> numel_by_dtype;
  /// Tensors with TensorPrecision::kept_fp32 set.
  int64_t kept_fp32_tensors = 0;
  int64_t low_precision_tensors = 0; ///< FP16 or BF16
  /// Linear layers whose products run in FP8 (TensorPrecision::float8).
  int64_t float8_layers = 0;
  /// Linear layers left out of FP8 in a model with FP8 layers
  /// (TensorPrecision::not_float8_reason).
  int64_t linear_layers_not_float8 = 0;

  /// A fixed-width table, one row per tensor, then the totals.
  std::string to_string() const;
};

/// The dtype of every parameter and buffer of `module`, which were kept in
/// FP32, which Linear layers compute in FP8 and why the others do not (in
/// a model converted by lamp::nn::convert_to_float8), and totals. Example:
/// \code
///   auto net = lamp::network_to_half(model, torch::kBFloat16);
///   std::cout << lamp::precision_report(*model).to_string();
/// \endcode
PrecisionReport precision_report(const torch::nn::Module& module);

/// How many convolutions and matrix multiplications ran in which dtype while
/// a piece of code ran: the op-level answer to "did it run in half precision".
struct OpPrecisionReport {
  /// op name ("aten::convolution", "aten::convolution_backward", "aten::mm",
  /// "aten::addmm", "aten::bmm", and attention by the kernel that ran it:
  /// "aten::_scaled_dot_product_flash_attention" (flash),
  /// "..._efficient_attention" (memory-efficient), "..._cudnn_attention",
  /// "..._flash_attention_for_cpu" (LibTorch 2.x's CPU kernel),
  /// "..._attention_math", each with its "_backward", or
  /// "lamp::math_attention", lamp::nn's formula on LibTorch 1.x), and
  /// "aten::_scaled_mm" (lamp::nn::float8_linear's FP8 products:
  /// Float8_e4m3fn forward, Float8_e5m2 backward) -> dtype name of its
  /// first tensor input -> calls.
  std::map<std::string, std::map<std::string, int64_t>> calls;

  /// Calls of `op` whose first input had `dtype` (0 when none).
  int64_t count(const std::string& op, torch::Dtype dtype) const;
  /// Calls of every counted op in `dtype`.
  int64_t total(torch::Dtype dtype) const;
  /// One line per op, in name order: `aten::convolution: BFloat16 2 Float 1`.
  std::string to_string() const;
};

/// Runs `fn` (one training step, say) and counts its convolution and matmul
/// calls per input dtype, through ATen's RecordFunction observers (the layer
/// under LibTorch's profiler), on every thread, so autograd's backward ops
/// count too. Under autocast the op is seen after the cast: an AMP step shows
/// its convolutions in FP16/BF16. Each call that computes counts once:
/// autocast's entry into an op it casts for (convolution, mm, addmm) is not
/// a second call, and the ops it passes through (convolution_backward,
/// attention's backward) count as well when backward() runs inside the
/// autocast guard.
///
/// Example:
/// \code
///   auto ops = lamp::op_precision_report([&] { train.step(loss_fn); });
///   std::cout << ops.to_string();  // aten::convolution: BFloat16 2 ...
/// \endcode
OpPrecisionReport op_precision_report(const std::function<void()>& fn);

} // namespace lamp
