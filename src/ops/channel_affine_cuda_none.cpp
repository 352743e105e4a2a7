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

} // namespace detail
} // namespace lamp
