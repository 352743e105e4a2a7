// The conv level's elementwise kernel on tensors: the checks, the output
// and the current stream around src/ops/channel_affine_kernels.cu.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <string>

#include "ops/channel_affine.h"
#include "ops/channel_affine_kernels.h"
#include "ops/kernel_tensors.h"

namespace lamp {
namespace detail {
namespace {

const float* floats_or_null(const torch::Tensor& t) {
  return t.defined() ? t.data_ptr<float>() : nullptr;
}

} // namespace

std::string channel_affine_kernel_unavailable_reason(
    const ChannelAffine& op, const torch::Tensor& like) {
  if (!like.defined() || like.dim() != 4 || like.numel() == 0) {
    return "the kernel takes a non-empty [N, C, H, W] output";
  }
  if (!like.is_cuda()) {
    return "the tensors are on the " + like.device().str();
  }
  if (!kernel_dtype(like.scalar_type())) {
    return std::string("the kernel takes FP32, FP16 and BF16, not ") +
           c10::toString(like.scalar_type());
  }
  const std::pair<const char*, const torch::Tensor*> full[] = {
      {"the input", &op.u},
      {"the gate", &op.gate},
      {"the second input", &op.v}};
  for (const auto& [name, t] : full) {
    if (!t->defined()) {
      continue;
    }
    if (t->device() != like.device() ||
        t->scalar_type() != like.scalar_type() || t->sizes() != like.sizes()) {
      return std::string(name) + " is not the output's shape, dtype and device";
    }
    if (!t->is_contiguous(at::MemoryFormat::ChannelsLast)) {
      return std::string(name) + " is not channels_last";
    }
  }
  const std::pair<const char*, const torch::Tensor*> params[] = {
      {"u_scale", &op.u_scale},
      {"u_shift", &op.u_shift},
      {"v_scale", &op.v_scale},
      {"v_shift", &op.v_shift}};
  for (const auto& [name, t] : params) {
    if (t->defined() &&
        (t->device() != like.device() || t->scalar_type() != at::kFloat ||
         t->numel() != like.size(1) || !t->is_contiguous())) {
      return std::string("the ") + name +
             " is not FP32 with one value per channel on the output's device";
    }
  }
  return "";
}

torch::Tensor channel_affine_kernel(const ChannelAffine& op,
                                    const torch::Tensor& like) {
  const auto why = channel_affine_kernel_unavailable_reason(op, like);
  TORCH_CHECK(why.empty(), "lamp::detail::channel_affine_kernel: ", why, ".");
  c10::cuda::CUDAGuard guard(like.device());
  auto out =
      at::empty(like.sizes(), like.options(), at::MemoryFormat::ChannelsLast);
  kernels::ChannelAffineArgs a;
  a.u = data_or_null(op.u);
  a.gate = data_or_null(op.gate);
  a.u_scale = floats_or_null(op.u_scale);
  a.u_shift = floats_or_null(op.u_shift);
  a.v = data_or_null(op.v);
  a.v_scale = floats_or_null(op.v_scale);
  a.v_shift = floats_or_null(op.v_shift);
  a.relu = op.relu;
  a.out = out.data_ptr();
  a.channels = like.size(1);
  a.rows = like.numel() / a.channels;
  a.dtype = kernel_code(like.scalar_type());
  a.vectorized = kernels::channel_affine_vectorizable(a);
  a.max_blocks = kernels::channel_affine_max_blocks(
      at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  C10_CUDA_CHECK(
      kernels::channel_affine(a, at::cuda::getCurrentCUDAStream().stream()));
  return out;
}

std::string gated_sums_kernel_unavailable_reason(const torch::Tensor& u,
                                                 const torch::Tensor& gate,
                                                 const torch::Tensor& a,
                                                 const torch::Tensor& b) {
  if (!u.defined()) {
    return "the sums need a defined input";
  }
  // The same rules as the elementwise kernel's, for an output like u.
  ChannelAffine first;
  first.u = u;
  first.gate = gate;
  first.v = a;
  auto why = channel_affine_kernel_unavailable_reason(first, u);
  if (why.empty() && b.defined()) {
    ChannelAffine second;
    second.v = b;
    why = channel_affine_kernel_unavailable_reason(second, u);
  }
  return why;
}

GatedSums gated_sums_kernel(const torch::Tensor& u, const torch::Tensor& gate,
                            const torch::Tensor& a, const torch::Tensor& b) {
  const auto why = gated_sums_kernel_unavailable_reason(u, gate, a, b);
  TORCH_CHECK(why.empty(), "lamp::detail::gated_sums_kernel: ", why, ".");
  c10::cuda::CUDAGuard guard(u.device());
  kernels::GatedSumsArgs args;
  args.u = u.data_ptr();
  args.gate = data_or_null(gate);
  args.a = data_or_null(a);
  args.b = data_or_null(b);
  args.channels = u.size(1);
  args.rows = u.numel() / args.channels;
  args.dtype = kernel_code(u.scalar_type());
  args.blocks = kernels::gated_sums_blocks(
      args.rows, at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  const auto f32 = u.options().dtype(at::kFloat);
  auto partial = at::empty({args.blocks, 3, args.channels}, f32);
  auto sums = at::empty({3, args.channels}, f32);
  args.partial = partial.data_ptr<float>();
  args.sums = sums.data_ptr<float>();
  C10_CUDA_CHECK(
      kernels::gated_sums(args, at::cuda::getCurrentCUDAStream().stream()));
  GatedSums out;
  out.g = sums[0];
  if (a.defined()) {
    out.ga = sums[1];
  }
  if (b.defined()) {
    out.gb = sums[2];
  }
  return out;
}

} // namespace detail
} // namespace lamp
