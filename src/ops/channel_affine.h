#pragma once

// The conv level's per-channel elementwise steps (the last BatchNorm, the
// shortcut and the ReLU at a residual block's end; the statistics'
// gradients folded into a convolution's output gradient; a prologue's scale
// on the data gradient) as one operation: lamp's CUDA kernel for NHWC
// tensors on the GPU (src/ops/channel_affine_cuda.cpp), the ATen ops in
// the same order everywhere else.

#include <torch/types.h>

#include <string>

namespace lamp {
namespace detail {

/// out = relu?((gate(u) * u_scale + u_shift) + (v * v_scale + v_shift)) in
/// FP32, each operation rounded in that order, then cast to the output's
/// dtype. gate(u) is u where gate > 0, else 0: a NaN gate gives 0, where
/// autograd's ReLU (threshold_backward: 0 where gate <= 0) passes u; a NaN
/// activation has made the loss NaN there already. An undefined tensor
/// leaves its step out (u:
/// zeros; v: no second term). u, gate and v have the output's shape
/// [N, C, H, W]; the scales and shifts are FP32 [C].
struct ChannelAffine {
  torch::Tensor u, gate, u_scale, u_shift, v, v_scale, v_shift;
  bool relu = false;
};

/// The ATen ops, one per step; the result has `like`'s dtype and memory
/// format (and sizes).
torch::Tensor channel_affine_reference(const ChannelAffine& op,
                                       const torch::Tensor& like);

/// "" when the kernel computes `op` for an output like `like`: lamp built
/// with its CUDA kernels, CUDA tensors of one dtype (FP32, FP16 or BF16),
/// channels_last, the scales and shifts FP32 with one value per channel;
/// otherwise why not.
std::string channel_affine_kernel_unavailable_reason(const ChannelAffine& op,
                                                     const torch::Tensor& like);

/// The kernel, after channel_affine_kernel_unavailable_reason() gave "";
/// the same bits as channel_affine_reference(), channels_last.
torch::Tensor channel_affine_kernel(const ChannelAffine& op,
                                    const torch::Tensor& like);

/// Per-channel sums over N, H and W of g = gate(u) (u where gate > 0, as
/// ChannelAffine's gate; u itself where gate is undefined) and of g a and
/// g b: FP32 [C] each, undefined where a or b is. u, gate, a and b have one
/// shape [N, C, H, W].
struct GatedSums {
  torch::Tensor g, ga, gb;
};

/// The ATen ops: g in FP32, then a sum per product.
GatedSums gated_sums_reference(const torch::Tensor& u,
                               const torch::Tensor& gate,
                               const torch::Tensor& a, const torch::Tensor& b);

/// "" when the sums' kernel takes the tensors (as
/// channel_affine_kernel_unavailable_reason() for an output like u),
/// otherwise why not.
std::string gated_sums_kernel_unavailable_reason(const torch::Tensor& u,
                                                 const torch::Tensor& gate,
                                                 const torch::Tensor& a,
                                                 const torch::Tensor& b);

/// The kernels (each block's partial sums, then the blocks' in order: the
/// same sums from run to run, in another order than ATen's), after
/// gated_sums_kernel_unavailable_reason() gave "".
GatedSums gated_sums_kernel(const torch::Tensor& u, const torch::Tensor& gate,
                            const torch::Tensor& a, const torch::Tensor& b);

/// The kernels where `use_kernel` and they apply, the reference otherwise;
/// `why` as channel_affine()'s.
GatedSums gated_sums(const torch::Tensor& u, const torch::Tensor& gate,
                     const torch::Tensor& a, const torch::Tensor& b,
                     bool use_kernel, std::string* why = nullptr);

/// The kernel where `use_kernel` and it applies, the reference otherwise.
/// `why`, when given, receives the reason a wanted kernel did not apply
/// ("" when it ran or was not wanted).
torch::Tensor channel_affine(const ChannelAffine& op, const torch::Tensor& like,
                             bool use_kernel, std::string* why = nullptr);

} // namespace detail
} // namespace lamp
