// The add+norm kernels for a lamp built without them: a LibTorch without
// CUDA, or no CUDA compiler at configure time (CMakeLists.txt).
// lamp::ops::add_layer_norm and add_rms_norm then run their ATen ops; this
// says why.
#include "ops/add_norm_cuda.h"

#include "platform/cuda_kernels_none.h"

namespace lamp {
namespace detail {

std::string add_norm_kernel_unavailable_reason(at::ScalarType, at::ScalarType,
                                               at::ScalarType, int64_t) {
  return cuda_kernels_missing_reason();
}

AddNormKernelForward add_norm_kernel_forward(const torch::Tensor&,
                                             const torch::Tensor&,
                                             const torch::Tensor&,
                                             const torch::Tensor&, double, bool,
                                             at::ScalarType, at::ScalarType) {
  TORCH_CHECK(false, "lamp::ops::add_norm: ",
              add_norm_kernel_unavailable_reason({}, {}, {}, 0), ".");
}

AddNormKernelBackward add_norm_kernel_backward(
    const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
    const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, bool,
    bool, bool, at::ScalarType) {
  TORCH_CHECK(false, "lamp::ops::add_norm: ",
              add_norm_kernel_unavailable_reason({}, {}, {}, 0), ".");
}

} // namespace detail
} // namespace lamp
