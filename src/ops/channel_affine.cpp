// The conv level's per-channel elementwise steps in ATen ops, and the
// choice between them and the kernel (src/ops/channel_affine.h).
#include "ops/channel_affine.h"

#include <torch/torch.h>

namespace lamp {
namespace detail {
namespace {

// [C] -> [1, C, 1, 1], to broadcast over an NCHW tensor.
torch::Tensor per_channel(const torch::Tensor& values) {
  return values.view({1, -1, 1, 1});
}

} // namespace

torch::Tensor channel_affine_reference(const ChannelAffine& op,
                                       const torch::Tensor& like) {
  auto t = op.u.defined() ? op.u.to(torch::kFloat)
                          : torch::zeros_like(like, torch::kFloat);
  if (op.gate.defined()) {
    t = t.masked_fill(op.gate.gt(0).logical_not(), 0.0);
  }
  if (op.u_scale.defined()) {
    t = t * per_channel(op.u_scale);
  }
  if (op.u_shift.defined()) {
    t = t + per_channel(op.u_shift);
  }
  if (op.v.defined()) {
    auto w = op.v.to(torch::kFloat);
    if (op.v_scale.defined()) {
      w = w * per_channel(op.v_scale);
    }
    if (op.v_shift.defined()) {
      w = w + per_channel(op.v_shift);
    }
    t = t + w;
  }
  if (op.relu) {
    t = torch::relu(t);
  }
  return t.to(like.scalar_type()).contiguous(like.suggest_memory_format());
}

torch::Tensor channel_affine(const ChannelAffine& op, const torch::Tensor& like,
                             bool use_kernel, std::string* why) {
  if (why != nullptr) {
    why->clear();
  }
  if (use_kernel) {
    auto reason = channel_affine_kernel_unavailable_reason(op, like);
    if (reason.empty()) {
      return channel_affine_kernel(op, like);
    }
    if (why != nullptr) {
      *why = std::move(reason);
    }
  }
  return channel_affine_reference(op, like);
}

} // namespace detail
} // namespace lamp
