// The conv level's elementwise kernel for a lamp built without it: a
// LibTorch without CUDA, or no CUDA compiler at configure time
// (CMakeLists.txt). channel_affine() then runs its ATen ops; this says why.
#include "ops/channel_affine.h"

#include "platform/cuda_kernels_none.h"

namespace lamp {
namespace detail {

std::string channel_affine_kernel_unavailable_reason(const ChannelAffine&,
                                                     const torch::Tensor&) {
  return cuda_kernels_missing_reason();
}

torch::Tensor channel_affine_kernel(const ChannelAffine& op,
                                    const torch::Tensor& like) {
  TORCH_CHECK(false, "lamp::detail::channel_affine_kernel: ",
              channel_affine_kernel_unavailable_reason(op, like), ".");
}

std::string gated_sums_kernel_unavailable_reason(const torch::Tensor&,
                                                 const torch::Tensor&,
                                                 const torch::Tensor&,
                                                 const torch::Tensor&) {
  return cuda_kernels_missing_reason();
}

GatedSums gated_sums_kernel(const torch::Tensor& u, const torch::Tensor& gate,
                            const torch::Tensor& a, const torch::Tensor& b) {
  TORCH_CHECK(false, "lamp::detail::gated_sums_kernel: ",
              gated_sums_kernel_unavailable_reason(u, gate, a, b), ".");
}

} // namespace detail
} // namespace lamp
