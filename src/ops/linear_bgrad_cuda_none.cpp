// The weight-gradient product with the bias gradient in its epilogue, for a
// lamp built without its CUDA kernels: a LibTorch without CUDA, or no CUDA
// compiler at configure time (cmake/LampCudaKernels.cmake).
// lamp::ops::linear_bgrad and gelu_mlp then run ATen ops; this says why.
#include "ops/linear_bgrad_cuda.h"

#include "platform/cuda_kernels_none.h"

namespace lamp {
namespace detail {

std::string linear_bgrad_unavailable_reason(at::ScalarType, int64_t, int64_t,
                                            int64_t) {
  return cuda_kernels_missing_reason();
}

bool linear_weight_bias_grad(const torch::Tensor&, const torch::Tensor&,
                             torch::Tensor&, torch::Tensor&, std::string& why) {
  why = cuda_kernels_missing_reason();
  return false;
}

} // namespace detail
} // namespace lamp
