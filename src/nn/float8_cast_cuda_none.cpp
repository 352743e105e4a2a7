// The one-pass FP8 cast for a lamp built without its CUDA kernels (a
// LibTorch without CUDA, or no CUDA compiler at configure time): the casts
// run their ATen ops; this says why.
#include "nn/float8_cast_cuda.h"

#include "platform/cuda_kernels_none.h"

namespace lamp {
namespace nn {
namespace internal {

std::string fused_cast_unavailable_reason(const torch::Tensor&) {
  return lamp::detail::cuda_kernels_missing_reason();
}

#if LAMP_TORCH_FLOAT8
Cast fused_cast_operand(const torch::Tensor&, const OperandState&, bool,
                        int64_t, torch::Dtype, bool) {
  TORCH_CHECK(false, "lamp::nn::float8: the fused cast: ",
              fused_cast_unavailable_reason({}), ".");
}
#endif

} // namespace internal
} // namespace nn
} // namespace lamp
