// The end of a step of delayed scaling for a lamp built without its CUDA
// kernels (a LibTorch without CUDA, or no CUDA compiler at configure time):
// the ATen ops run; this says why.
#include "nn/float8_scale_cuda.h"

#include "platform/cuda_kernels_none.h"

namespace lamp {
namespace nn {
namespace internal {

std::string fused_scale_update_unavailable_reason(const Float8StateImpl&) {
  return lamp::detail::cuda_kernels_missing_reason();
}

void fused_update_scales(const std::vector<Float8StateImpl*>& states) {
  TORCH_CHECK(states.empty(), "lamp::nn::update_float8_scales: the fused ",
              "update: ", lamp::detail::cuda_kernels_missing_reason(), ".");
}

} // namespace internal
} // namespace nn
} // namespace lamp
