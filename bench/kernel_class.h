#pragma once

// lamp_bench --profile, the rules: which kernel class an op or a kernel is
// (by its name and the phase of the step it ran in), and what its memory
// traffic and FLOPs are from its recorded shapes. Names in, answers out: no
// profiler here, so the rules are unit-tested on the names LibTorch and
// cuDNN give (bench/kernel_class_test.cpp).

#include <cstdint>
#include <string>
#include <vector>

namespace lamp_bench {

/// Whether `text` begins with `prefix` (std::string::starts_with is C++20's).
bool starts_with(const std::string& text, const char* prefix);

/// The rows of the table, in the order printed.
enum class KernelClass {
  kConvForward,
  kConvDgrad, ///< a convolution's input gradient (CUDA kernels named so)
  kConvWgrad, ///< a convolution's weight gradient (CUDA kernels named so)
  /// Convolution backward not split by direction: ATen's CPU kernels compute
  /// both gradients in one op, and CUDA kernels whose name says neither.
  kConvBackward,
  /// Convolutions with BatchNorm folded in (lamp::ops::folded_conv's cuDNN
  /// graphs: statistics epilogue, scale-bias-ReLU prologue, the fused
  /// backward): the kernels launched inside its "lamp::folded_conv" scopes.
  /// Replayed from a CUDA graph they have no launching op and count by
  /// their names (fprop, dgrad, wgrad).
  kConvBatchNorm,
  /// Matrix products: cuBLAS and CUTLASS GEMM kernels, ATen's mm, addmm,
  /// bmm, linear, _scaled_mm (a transformer's Linear layers).
  kMatmul,
  /// Fused attention (flash, memory-efficient, cuDNN) and
  /// scaled_dot_product_attention with what it calls.
  kAttention,
  kBatchNorm,
  /// The other normalisations: LayerNorm, RMSNorm, GroupNorm.
  kNorm,
  /// Softmax and the loss (cross entropy, NLL).
  kSoftmaxLoss,
  kElementwise,
  /// The update after the backward pass: the optimizer and the GradScaler
  /// (loss scaling, unscale, inf check, scale update).
  kOptimizer,
  kCopy, ///< copies and casts, memcpy and memset
  kOther,
};

/// Every class, in table order.
const std::vector<KernelClass>& kernel_classes();
/// The convolution classes (the folded one included).
bool is_convolution(KernelClass kernel_class);
/// The classes whose rate is in FLOP/s: the convolutions and the matrix
/// products (the profiler estimates their FLOPs).
bool rated_in_flops(KernelClass kernel_class);
/// The row's label: "conv forward", "conv dgrad", ..., "other".
std::string to_string(KernelClass kernel_class);

/// Where in the training step an op ran, from the scopes around it.
enum class StepPhase {
  kUnknown,  ///< outside the step's scopes (or a CUDA-graph replay)
  kForward,  ///< inside kForwardScope (forward pass and loss)
  kBackward, ///< inside an autograd engine node
  kUpdate,   ///< the rest of a step: loss scaling, unscale, optimizer, copies
};

/// The RecordFunction scopes lamp_bench opens around each profiled step and
/// around its forward pass and loss.
constexpr const char* kStepScope = "lamp_bench::step";
constexpr const char* kForwardScope = "lamp_bench::forward";

/// The classification rules, for an ATen op or RecordFunction name
/// ("aten::convolution_backward", "autograd::engine::evaluate_function:
/// NativeBatchNormBackward0") and for a CUDA kernel name (cuDNN's
/// "sm90_xmma_dgrad_implicit_gemm_...", "Memcpy DtoD"), in this order:
///  0. the folded convolutions' scopes: a name starting "lamp::folded_conv";
///  1. copies: a name with "copy", "memcpy" or "memset", aten::to, clone,
///     contiguous;
///  2. anything else in the update phase: optimizer;
///  3. optimizer: fused and multi-tensor kernels and ops (_fused_sgd_,
///     multi_tensor_apply, _foreach_*), the GradScaler's _amp_* ops;
///  4. attention: "attention", "flash_fwd", "flash_bwd", "fmha", "sdpa";
///  5. BatchNorm: "batch_norm", "batchnorm", cuDNN's "bn_fw"/"bn_bw";
///     other norms: "layer_norm", "layernorm", "rms_norm", "rmsnorm",
///     "group_norm", ATen's "GammaBetaBackward" kernels;
///  6. convolution: "dgrad" and "wgrad" by direction, "fprop" forward; other
///     convolution names: backward when they say "backward", forward for an
///     ATen op, and for a kernel by the phase (other when unknown);
///  7. matmul: kernels named "gemm", "gemv", "nvjet" or "splitkreduce" (after
///     the convolutions, whose "implicit_gemm" kernels say their direction);
///     ATen's mm, addmm, bmm, baddbmm, matmul, linear, _scaled_mm and their
///     autograd nodes;
///  8. softmax and loss: "softmax", "cross_entropy", "nll_loss";
///  9. elementwise: kernels named "elementwise", "vectorized", "unrolled";
///     ATen's pointwise ops (add, mul, relu, threshold_backward, fill_ ...);
/// 10. other.
/// A GEMM kernel that a convolution launched (cuDNN runs some 1x1
/// convolutions as GEMMs) is the convolution's: summarize() sees to that.
/// Case is ignored.
KernelClass classify(const std::string& name, StepPhase phase);

/// The bytes one element of a profiler dtype name takes ("float" 4,
/// "c10::BFloat16" 2, ...); 0 for a name that is no tensor dtype ("Scalar",
/// "", "TensorList").
int64_t dtype_bytes(const std::string& dtype);

/// The least memory traffic of an ATen op from its recorded input shapes and
/// dtypes, or -1 where this is not known: aten::copy_ reads its source and
/// writes its destination; a pointwise or BatchNorm op reads its tensor
/// inputs and writes one output as large as the largest of them (a lower
/// bound: BatchNorm's statistics read the input once more). Other ops,
/// ops without recorded shapes and ops with an input of unknown size
/// (TensorList) are not known.
int64_t traffic_bytes(const std::string& name,
                      const std::vector<std::vector<int64_t>>& shapes,
                      const std::vector<std::string>& dtypes);

/// The multiply-add FLOPs (2 per multiply-add) of one direction (input or
/// weight gradient) of a convolution's backward, from
/// aten::convolution_backward's shapes (grad_output, input, weight): each is
/// the forward's count. -1 where the shapes are missing.
int64_t conv_backward_flops_per_direction(
    const std::vector<std::vector<int64_t>>& shapes);

} // namespace lamp_bench
