// lamp_bench --profile's rules (bench/kernel_class.h) on the kernel and op
// names LibTorch 1.13 / 2.11 and cuDNN 9 give.
#include "kernel_class.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace lamp_bench {
namespace {

KernelClass kernel(const std::string& name,
                   StepPhase phase = StepPhase::kUnknown) {
  return classify(name, phase);
}

TEST(ProfileClassify, CudnnAndCutlassConvolutionsByDirection) {
  EXPECT_EQ(
      kernel(
          "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64"),
      KernelClass::kConvForward);
  EXPECT_EQ(
      kernel(
          "sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nchw"),
      KernelClass::kConvDgrad);
  EXPECT_EQ(
      kernel(
          "sm90_xmma_wgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc"),
      KernelClass::kConvWgrad);
  EXPECT_EQ(kernel("cutlass_tensorop_h16816dgrad_optimized_128x128_32x3_nhwc"),
            KernelClass::kConvDgrad);
  EXPECT_EQ(kernel("void cudnn::detail::wgrad_alg0_engine<float, 128, 5>"),
            KernelClass::kConvWgrad);
  // No direction in the name: the phase of the op that launched it.
  const std::string direct =
      "void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3>";
  EXPECT_EQ(kernel(direct, StepPhase::kForward), KernelClass::kConvForward);
  EXPECT_EQ(kernel(direct, StepPhase::kBackward), KernelClass::kConvBackward);
  EXPECT_EQ(kernel(direct), KernelClass::kOther);
}

TEST(ProfileClassify, FoldedConvolutionScopes) {
  EXPECT_EQ(classify("lamp::folded_conv_forward", StepPhase::kForward),
            KernelClass::kConvBatchNorm);
  EXPECT_EQ(classify("lamp::folded_conv_dgrad", StepPhase::kBackward),
            KernelClass::kConvBatchNorm);
  EXPECT_TRUE(is_convolution(KernelClass::kConvBatchNorm));
  EXPECT_EQ(to_string(KernelClass::kConvBatchNorm), "conv+BN folded");
}

TEST(ProfileClassify, BatchNormElementwiseCopiesAndOptimizerKernels) {
  EXPECT_EQ(
      kernel(
          "void at::native::batch_norm_collect_statistics_channels_last_kernel<...>"),
      KernelClass::kBatchNorm);
  EXPECT_EQ(
      kernel(
          "void at::native::batch_norm_backward_elemt_channels_last_kernel<...>"),
      KernelClass::kBatchNorm);
  EXPECT_EQ(
      kernel("void cudnn::bn_fw_tr_1C11_singleread_spec<__nv_bfloat16, 512>"),
      KernelClass::kBatchNorm);
  EXPECT_EQ(kernel("void cudnn::bn_bw_1C11_kernel_new<float, float2, 512>"),
            KernelClass::kBatchNorm);
  EXPECT_EQ(
      kernel(
          "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>"),
      KernelClass::kElementwise);
  EXPECT_EQ(kernel("void at::native::unrolled_elementwise_kernel<...>"),
            KernelClass::kElementwise);
  EXPECT_EQ(
      kernel(
          "void at::native::elementwise_kernel<128, 4, at::native::direct_copy_kernel_cuda(...)>"),
      KernelClass::kCopy);
  EXPECT_EQ(kernel("Memcpy DtoD (Device -> Device)"), KernelClass::kCopy);
  EXPECT_EQ(kernel("Memset (Device)"), KernelClass::kCopy);
  EXPECT_EQ(
      kernel(
          "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedSgdMathFunctor<float, 3>>"),
      KernelClass::kOptimizer);
  EXPECT_EQ(kernel("void at::native::amp_update_scale_cuda_kernel(...)"),
            KernelClass::kOptimizer);
}

// A transformer's kernels, as cuBLAS, PyTorch's flash and memory-efficient
// attention, cuDNN's SDPA and ATen's norms and losses name them.
TEST(ProfileClassify, TransformerKernels) {
  EXPECT_EQ(kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64"),
            KernelClass::kMatmul);
  EXPECT_EQ(kernel("nvjet_tst_128x256_64x4_1x2_h_bz_coopB_NNT"),
            KernelClass::kMatmul);
  EXPECT_EQ(
      kernel(
          "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(...)"),
      KernelClass::kMatmul);
  EXPECT_EQ(
      kernel(
          "void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, false>(...)"),
      KernelClass::kMatmul);
  EXPECT_EQ(
      kernel(
          "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t>>(...)"),
      KernelClass::kAttention);
  EXPECT_EQ(
      kernel(
          "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>(...)"),
      KernelClass::kAttention);
  EXPECT_EQ(
      kernel(
          "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)"),
      KernelClass::kAttention);
  EXPECT_EQ(
      kernel(
          "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0"),
      KernelClass::kAttention);
  EXPECT_EQ(
      kernel(
          "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(...)"),
      KernelClass::kNorm);
  EXPECT_EQ(
      kernel(
          "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel_32x32<c10::BFloat16, float>(...)"),
      KernelClass::kNorm);
  EXPECT_EQ(
      kernel(
          "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(...)"),
      KernelClass::kSoftmaxLoss);
  EXPECT_EQ(
      kernel(
          "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(...)"),
      KernelClass::kSoftmaxLoss);
  EXPECT_EQ(
      kernel(
          "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(...)>"),
      KernelClass::kElementwise);
}

TEST(ProfileClassify, AtenOpsAndAutogradNodes) {
  const auto forward = StepPhase::kForward, backward = StepPhase::kBackward;
  EXPECT_EQ(kernel("aten::conv2d", forward), KernelClass::kConvForward);
  EXPECT_EQ(kernel("aten::mkldnn_convolution", forward),
            KernelClass::kConvForward);
  EXPECT_EQ(kernel("aten::convolution_backward", backward),
            KernelClass::kConvBackward);
  EXPECT_EQ(kernel("autograd::engine::evaluate_function: ConvolutionBackward0",
                   backward),
            KernelClass::kConvBackward);
  EXPECT_EQ(kernel("aten::batch_norm", forward), KernelClass::kBatchNorm);
  EXPECT_EQ(kernel("aten::native_batch_norm_backward", backward),
            KernelClass::kBatchNorm);
  EXPECT_EQ(
      kernel("autograd::engine::evaluate_function: NativeBatchNormBackward0",
             backward),
      KernelClass::kBatchNorm);
  EXPECT_EQ(kernel("aten::relu_", forward), KernelClass::kElementwise);
  EXPECT_EQ(kernel("aten::add_", forward), KernelClass::kElementwise);
  EXPECT_EQ(kernel("aten::threshold_backward", backward),
            KernelClass::kElementwise);
  EXPECT_EQ(kernel("aten::to", forward), KernelClass::kCopy);
  EXPECT_EQ(kernel("aten::_to_copy", forward), KernelClass::kCopy);
  EXPECT_EQ(
      kernel("autograd::engine::evaluate_function: ToCopyBackward0", backward),
      KernelClass::kCopy);
  EXPECT_EQ(kernel("aten::_fused_sgd_"), KernelClass::kOptimizer);
  EXPECT_EQ(kernel("aten::_foreach_add_"), KernelClass::kOptimizer);
  EXPECT_EQ(kernel("aten::_amp_foreach_non_finite_check_and_unscale_"),
            KernelClass::kOptimizer);
  EXPECT_EQ(kernel("aten::mm", forward), KernelClass::kMatmul);
  EXPECT_EQ(kernel("aten::linear", forward), KernelClass::kMatmul);
  EXPECT_EQ(kernel("aten::_scaled_mm", forward), KernelClass::kMatmul);
  EXPECT_EQ(
      kernel("autograd::engine::evaluate_function: AddmmBackward0", backward),
      KernelClass::kMatmul);
  EXPECT_EQ(kernel("aten::scaled_dot_product_attention", forward),
            KernelClass::kAttention);
  EXPECT_EQ(
      kernel(
          "autograd::engine::evaluate_function: ScaledDotProductFlashAttentionForCpuBackward0",
          backward),
      KernelClass::kAttention);
  EXPECT_EQ(kernel("aten::native_layer_norm", forward), KernelClass::kNorm);
  EXPECT_EQ(kernel("autograd::engine::evaluate_function: "
                   "NativeLayerNormBackward0",
                   backward),
            KernelClass::kNorm);
  EXPECT_EQ(kernel("aten::cross_entropy_loss", forward),
            KernelClass::kSoftmaxLoss);
  EXPECT_EQ(
      kernel("autograd::engine::evaluate_function: NllLossBackward0", backward),
      KernelClass::kSoftmaxLoss);
  // Names that only look alike stay where they were.
  EXPECT_EQ(kernel("aten::embedding", forward), KernelClass::kOther);
  EXPECT_EQ(kernel("aten::mean", forward), KernelClass::kOther);
  EXPECT_EQ(
      kernel("autograd::engine::evaluate_function: MeanBackward0", backward),
      KernelClass::kOther);
}

TEST(ProfileClassify, UpdatePhaseIsOptimizerExceptCopies) {
  // A per-tensor SGD's ops and the GradScaler's checks after the backward.
  EXPECT_EQ(kernel("aten::add_", StepPhase::kUpdate), KernelClass::kOptimizer);
  EXPECT_EQ(kernel("aten::isfinite", StepPhase::kUpdate),
            KernelClass::kOptimizer);
  EXPECT_EQ(
      kernel("void at::native::vectorized_elementwise_kernel<4, MulFunctor>",
             StepPhase::kUpdate),
      KernelClass::kOptimizer);
  // Master weights copied back stay copies.
  EXPECT_EQ(kernel("aten::copy_", StepPhase::kUpdate), KernelClass::kCopy);
  EXPECT_EQ(kernel("aten::_foreach_copy_", StepPhase::kUpdate),
            KernelClass::kCopy);
}

TEST(ProfileTraffic, BytesFromShapesAndDtypes) {
  EXPECT_EQ(dtype_bytes("float"), 4);
  EXPECT_EQ(dtype_bytes("c10::BFloat16"), 2);
  EXPECT_EQ(dtype_bytes("c10::Half"), 2);
  EXPECT_EQ(dtype_bytes("Scalar"), 0);
  EXPECT_EQ(dtype_bytes(""), 0);
  // A cast: the FP32 source read, the BF16 destination written.
  EXPECT_EQ(traffic_bytes("aten::copy_", {{64, 3, 3, 3}, {64, 3, 3, 3}, {}},
                          {"c10::BFloat16", "float", "Scalar"}),
            1728 * 2 + 1728 * 4);
  // In place: self and other read, self written.
  EXPECT_EQ(traffic_bytes("aten::add_", {{8, 64}, {8, 64}, {}},
                          {"float", "float", "Scalar"}),
            3 * 8 * 64 * 4);
  EXPECT_EQ(traffic_bytes("aten::relu", {{100}}, {"c10::BFloat16"}),
            2 * 100 * 2);
  EXPECT_EQ(traffic_bytes("aten::fill_", {{100}, {}}, {"float", "Scalar"}),
            100 * 4);
  // BatchNorm: the input read, the output written, the parameters and
  // statistics read (an undefined optional tensor counts nothing).
  EXPECT_EQ(traffic_bytes("aten::native_batch_norm",
                          {{8, 16, 4, 4}, {16}, {}, {16}, {16}, {}, {}, {}},
                          {"c10::BFloat16", "float", "", "float", "float",
                           "Scalar", "Scalar", "Scalar"}),
            2 * 8 * 16 * 4 * 4 * 2 + 3 * 16 * 4);
  EXPECT_EQ(traffic_bytes("aten::mm", {{4, 4}, {4, 4}}, {"float", "float"}),
            -1);
  EXPECT_EQ(traffic_bytes("aten::add_", {}, {}), -1);
  EXPECT_EQ(traffic_bytes("aten::add_", {{}, {}}, {"", ""}), -1);
}

TEST(ProfileTraffic, ConvolutionBackwardFlopsPerDirection) {
  // grad_output [8, 64, 32, 32], input [8, 3, 32, 32], weight [64, 3, 3, 3]:
  // the forward's 2 * 8*64*32*32 * 3*3*3.
  EXPECT_EQ(conv_backward_flops_per_direction(
                {{8, 64, 32, 32}, {8, 3, 32, 32}, {64, 3, 3, 3}, {}}),
            28311552);
  EXPECT_EQ(conv_backward_flops_per_direction({{8, 64, 32, 32}}), -1);
}

} // namespace
} // namespace lamp_bench
