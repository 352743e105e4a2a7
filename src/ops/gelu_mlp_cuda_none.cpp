// gelu_mlp's cuBLASLt products for a lamp built without its CUDA kernels:
// a LibTorch without CUDA, or no CUDA compiler at configure time
// (cmake/LampCudaKernels.cmake). lamp::ops::gelu_mlp then runs its ATen
// ops; this says why.
#include "ops/gelu_mlp_cuda.h"

#include "platform/cuda_kernels_none.h"

namespace lamp {
namespace detail {

std::string gelu_mlp_epilogue_unavailable_reason(at::ScalarType, int64_t,
                                                 int64_t, int64_t, int64_t) {
  return cuda_kernels_missing_reason();
}

bool gelu_mlp_fc_forward(const torch::Tensor&, const torch::Tensor&,
                         const torch::Tensor&, torch::Tensor&, torch::Tensor&,
                         std::string& why) {
  why = gelu_mlp_epilogue_unavailable_reason({}, 0, 0, 0, 0);
  return false;
}

bool gelu_mlp_proj_backward(const torch::Tensor&, const torch::Tensor&,
                            const torch::Tensor&, bool, torch::Tensor&,
                            torch::Tensor&, std::string& why) {
  why = gelu_mlp_epilogue_unavailable_reason({}, 0, 0, 0, 0);
  return false;
}

} // namespace detail
} // namespace lamp
