// lamp's one-pass FP8 cast on tensors: the checks, the allocations and the
// current stream around src/nn/float8_cast_kernels.cu.
#include "nn/float8_cast_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cmath>

#include "nn/float8_cast_kernels.h"
#include "platform/kernel_runs.h"

namespace lamp {
namespace nn {
namespace internal {

std::string fused_cast_unavailable_reason(const torch::Tensor& t) {
  if (!t.is_cuda()) {
    return "the tensor is on " + t.device().str() + ", the kernel is CUDA's";
  }
  const auto dtype = t.scalar_type();
  if (dtype != torch::kFloat && dtype != torch::kHalf &&
      dtype != torch::kBFloat16) {
    return std::string("the kernel casts FP32, FP16 and BF16, not ") +
           c10::toString(dtype);
  }
  if (t.numel() == 0) {
    return "the tensor is empty";
  }
  return "";
}

#if LAMP_TORCH_FLOAT8
Cast fused_cast_operand(const torch::Tensor& t, const OperandState& s,
                        bool delayed, int64_t margin, torch::Dtype dtype,
                        bool transpose) {
  TORCH_INTERNAL_ASSERT(!transpose || t.dim() == 2,
                        "lamp::nn::float8: a transposed cast takes a 2-D "
                        "tensor, got ",
                        t.dim(), " dimensions");
  c10::cuda::CUDAGuard guard(t.device());
  const auto input = t.contiguous();
  const auto f32 = input.options().dtype(torch::kFloat);
  auto data = torch::empty(input.sizes(), input.options().dtype(dtype));
  torch::Tensor transposed;
  if (transpose) {
    transposed = torch::empty({input.size(1), input.size(0)}, data.options());
  }
  auto inverse_scale = torch::empty({}, f32);
  auto cast_scale = torch::empty({}, f32);
  const int64_t blocks = kernels::float8_cast_blocks(
      input.numel(),
      at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  auto partial = torch::empty({blocks}, input.options().dtype(torch::kInt));
  auto done = torch::zeros({1}, input.options().dtype(torch::kInt));

  kernels::Float8CastArgs a;
  a.input = input.data_ptr();
  a.numel = input.numel();
  a.source = input.scalar_type() == torch::kHalf ? kernels::Float8Source::kHalf
             : input.scalar_type() == torch::kBFloat16
                 ? kernels::Float8Source::kBFloat16
                 : kernels::Float8Source::kFloat;
  a.output = data.data_ptr();
  a.format = dtype == c10::ScalarType::Float8_e5m2
                 ? kernels::Float8Format::kE5M2
                 : kernels::Float8Format::kE4M3;
  const double max = detail::float8_max(dtype);
  a.max = static_cast<float>(max);
  // The ATen ops' comparison: an FP32 product against the threshold in FP32.
  a.saturated_above = static_cast<float>(max * internal::kSaturationSlack);
  // As amax_to_scale's ATen ops round it: the quotient in double, then FP32.
  a.max_over_margin = kernels::float8_max_over_margin(max, margin);
  a.delayed = delayed;
  a.scale = s.scale.data_ptr<float>();
  a.cast_scale = cast_scale.data_ptr<float>();
  a.pending_amax = s.pending_amax.data_ptr<float>();
  a.saturated = s.saturated.data_ptr<float>();
  a.non_finite = s.non_finite.data_ptr<float>();
  a.last_scale = s.last_scale.data_ptr<float>();
  a.casts = s.casts.data_ptr<float>();
  a.inverse_scale = inverse_scale.data_ptr<float>();
  a.partial_amax = reinterpret_cast<unsigned*>(partial.data_ptr<int>());
  a.blocks_done = reinterpret_cast<unsigned*>(done.data_ptr<int>());
  a.blocks = static_cast<int>(blocks);
  if (transpose) {
    a.transposed = transposed.data_ptr();
    a.rows = input.size(0);
    a.cols = input.size(1);
  }
  C10_CUDA_CHECK(
      kernels::float8_cast(a, at::cuda::getCurrentCUDAStream().stream()));
  lamp::detail::note_kernel_run(lamp::detail::KernelPath::kFloat8Cast);
  return {data, inverse_scale, transposed};
}
#endif

} // namespace internal
} // namespace nn
} // namespace lamp
