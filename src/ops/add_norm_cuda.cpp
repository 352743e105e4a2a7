// lamp::ops::add_layer_norm's and add_rms_norm's CUDA kernels on tensors:
// the checks, the allocations and the current stream around the launchers
// of src/ops/add_norm_kernels.cu.
#include "ops/add_norm_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <limits>

#include "ops/add_norm_kernels.h"
#include "ops/kernel_tensors.h"
#include "platform/kernel_runs.h"

namespace lamp {
namespace detail {

std::string add_norm_kernel_unavailable_reason(at::ScalarType sum,
                                               at::ScalarType branch,
                                               at::ScalarType normed,
                                               int64_t rows) {
  for (const auto dtype : {sum, branch, normed}) {
    if (!kernel_dtype(dtype)) {
      return std::string("the kernel takes FP32, FP16 and BF16, not ") +
             c10::toString(dtype);
    }
  }
  if (rows > std::numeric_limits<int32_t>::max()) {
    return "the kernel takes at most 2^31 - 1 rows, got " +
           std::to_string(rows);
  }
  return "";
}

AddNormKernelForward add_norm_kernel_forward(
    const torch::Tensor& x, const torch::Tensor& branch,
    const torch::Tensor& weight, const torch::Tensor& bias, double eps,
    bool rms, at::ScalarType sum_dtype, at::ScalarType normed_dtype) {
  c10::cuda::CUDAGuard guard(x.device());
  const auto xs = x.to(sum_dtype).contiguous();
  const auto b = branch.contiguous();
  const int64_t rows = xs.size(0);
  const int64_t width = xs.size(1);
  AddNormKernelForward out;
  out.sum = torch::empty_like(xs);
  out.normed = torch::empty({rows, width}, xs.options().dtype(normed_dtype));
  out.mean = torch::empty({rows}, xs.options().dtype(at::kFloat));
  out.rstd = torch::empty({rows}, xs.options().dtype(at::kFloat));
  kernels::AddNormForwardArgs args;
  args.x = xs.data_ptr();
  args.branch = b.data_ptr();
  args.weight = static_cast<const float*>(data_or_null(weight));
  args.bias = static_cast<const float*>(data_or_null(bias));
  args.sum = out.sum.data_ptr();
  args.normed = out.normed.data_ptr();
  args.mean = out.mean.data_ptr<float>();
  args.rstd = out.rstd.data_ptr<float>();
  args.rows = rows;
  args.width = width;
  args.eps = static_cast<float>(eps);
  args.rms = rms;
  args.sum_dtype = kernel_code(sum_dtype);
  args.branch_dtype = kernel_code(b.scalar_type());
  args.normed_dtype = kernel_code(normed_dtype);
  C10_CUDA_CHECK(kernels::add_norm_forward(
      args, at::cuda::getCurrentCUDAStream().stream()));
  note_kernel_run(KernelPath::kAddNorm);
  return out;
}

AddNormKernelBackward add_norm_kernel_backward(
    const torch::Tensor& grad_normed, const torch::Tensor& grad_sum,
    const torch::Tensor& sum, const torch::Tensor& mean,
    const torch::Tensor& rstd, const torch::Tensor& weight, bool rms,
    bool want_weight, bool want_bias, at::ScalarType branch_dtype) {
  c10::cuda::CUDAGuard guard(sum.device());
  const int64_t rows = sum.size(0);
  const int64_t width = sum.size(1);
  // The output's gradient in its own dtype where the kernel takes it.
  const auto gy = !grad_normed.defined() ? torch::Tensor()
                  : kernel_dtype(grad_normed.scalar_type())
                      ? grad_normed.contiguous()
                      : grad_normed.to(at::kFloat).contiguous();
  const auto gs = grad_sum.defined()
                      ? grad_sum.to(sum.scalar_type()).contiguous()
                      : torch::Tensor();
  // Enough blocks to fill the device a few times over; each adds its rows'
  // parts of the weight's and the bias's gradients in one row of partials.
  const int64_t blocks = kernels::add_norm_backward_blocks(
      rows, at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  const auto f32 = sum.options().dtype(at::kFloat);
  AddNormKernelBackward out;
  out.x = torch::empty_like(sum);
  out.branch = torch::empty({rows, width}, sum.options().dtype(branch_dtype));
  torch::Tensor partial_weight, partial_bias;
  if (want_weight) {
    partial_weight = torch::zeros({blocks, width}, f32);
    out.weight = torch::empty({width}, f32);
  }
  if (want_bias) {
    partial_bias = torch::zeros({blocks, width}, f32);
    out.bias = torch::empty({width}, f32);
  }
  kernels::AddNormBackwardArgs args;
  args.grad_normed = data_or_null(gy);
  args.grad_sum = data_or_null(gs);
  args.sum = sum.data_ptr();
  args.weight = static_cast<const float*>(data_or_null(weight));
  args.mean = mean.data_ptr<float>();
  args.rstd = rstd.data_ptr<float>();
  args.grad_x = out.x.data_ptr();
  args.grad_branch = out.branch.data_ptr();
  args.partial_weight = static_cast<float*>(
      partial_weight.defined() ? partial_weight.data_ptr() : nullptr);
  args.partial_bias = static_cast<float*>(
      partial_bias.defined() ? partial_bias.data_ptr() : nullptr);
  args.grad_weight = static_cast<float*>(
      out.weight.defined() ? out.weight.data_ptr() : nullptr);
  args.grad_bias =
      static_cast<float*>(out.bias.defined() ? out.bias.data_ptr() : nullptr);
  args.rows = rows;
  args.width = width;
  args.blocks = static_cast<int>(blocks);
  args.rms = rms;
  args.sum_dtype = kernel_code(sum.scalar_type());
  args.branch_dtype = kernel_code(branch_dtype);
  args.normed_dtype =
      gy.defined() ? kernel_code(gy.scalar_type()) : kernels::Dtype::kFloat;
  C10_CUDA_CHECK(kernels::add_norm_backward(
      args, at::cuda::getCurrentCUDAStream().stream()));
  note_kernel_run(KernelPath::kAddNorm);
  return out;
}

} // namespace detail
} // namespace lamp
