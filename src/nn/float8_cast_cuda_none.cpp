// The one-pass FP8 cast for a lamp built without its CUDA kernels (a
// LibTorch without CUDA, or no CUDA compiler at configure time): the casts
// run their ATen ops; this says why.
#include "nn/float8_cast_cuda.h"

namespace lamp {
namespace nn {
namespace internal {

std::string fused_cast_unavailable_reason(const torch::Tensor&) {
#if LAMP_WITH_CUDA
  return "this lamp was built without its CUDA kernels: no CUDA compiler was "
         "found at configure time, or LAMP_CUDA_KERNELS was OFF";
#else
  return "this lamp was built against a LibTorch without CUDA";
#endif
}

#if LAMP_TORCH_FLOAT8
Cast fused_cast_operand(const torch::Tensor&, const OperandState&, bool,
                        int64_t, torch::Dtype) {
  TORCH_CHECK(false, "lamp::nn::float8: the fused cast: ",
              fused_cast_unavailable_reason({}), ".");
}
#endif

} // namespace internal
} // namespace nn
} // namespace lamp
