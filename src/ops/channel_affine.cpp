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

// t where gate > 0, else 0 (a NaN gate too), in t's memory format (where
// masked_fill's copy would be NCHW, and a channels_last sum then adds in
// another order).
torch::Tensor gated(const torch::Tensor& t, const torch::Tensor& gate) {
  return torch::where(gate.gt(0), t, torch::zeros({}, t.options()));
}

} // namespace

torch::Tensor channel_affine_reference(const ChannelAffine& op,
                                       const torch::Tensor& like) {
  auto t = op.u.defined() ? op.u.to(torch::kFloat)
                          : torch::zeros_like(like, torch::kFloat);
  if (op.gate.defined()) {
    t = gated(t, op.gate);
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

GatedSums gated_sums_reference(const torch::Tensor& u,
                               const torch::Tensor& gate,
                               const torch::Tensor& a, const torch::Tensor& b) {
  auto g = u.to(torch::kFloat);
  if (gate.defined()) {
    g = gated(g, gate);
  }
  GatedSums sums;
  sums.g = g.sum({0, 2, 3});
  if (a.defined()) {
    sums.ga = (g * a.to(torch::kFloat)).sum({0, 2, 3});
  }
  if (b.defined()) {
    sums.gb = (g * b.to(torch::kFloat)).sum({0, 2, 3});
  }
  return sums;
}

GatedSums gated_sums(const torch::Tensor& u, const torch::Tensor& gate,
                     const torch::Tensor& a, const torch::Tensor& b,
                     bool use_kernel, std::string* why) {
  if (why != nullptr) {
    why->clear();
  }
  if (use_kernel) {
    auto reason = gated_sums_kernel_unavailable_reason(u, gate, a, b);
    if (reason.empty()) {
      return gated_sums_kernel(u, gate, a, b);
    }
    if (why != nullptr) {
      *why = std::move(reason);
    }
  }
  return gated_sums_reference(u, gate, a, b);
}

} // namespace detail
} // namespace lamp
