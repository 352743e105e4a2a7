// The add+norm kernels for a lamp built without them: a LibTorch without
// CUDA, or no CUDA compiler at configure time (CMakeLists.txt).
// lamp::ops::add_layer_norm and add_rms_norm then run their ATen ops; this
// says why.
#include "ops/add_norm_cuda.h"

namespace lamp {
namespace detail {

std::string add_norm_kernel_unavailable_reason(at::ScalarType, at::ScalarType,
                                               at::ScalarType, int64_t) {
#if LAMP_WITH_CUDA
  return "this lamp was built without its CUDA kernels: no CUDA compiler was "
         "found at configure time, or LAMP_CUDA_KERNELS was OFF. Reconfigure "
         "with nvcc on PATH (or -DCMAKE_CUDA_COMPILER=<nvcc>)";
#else
  return "this lamp was built against a LibTorch without CUDA";
#endif
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
