// cuDNN's fused BatchNorm kernels for a lamp built without them: a LibTorch
// without CUDA, or cuDNN's headers not found at configure time
// (CMakeLists.txt). lamp::ops::batch_norm_relu then always runs the stock
// composition; these say why.
#include "ops/cudnn_batch_norm.h"

namespace lamp {
namespace detail {

std::string cudnn_batch_norm_unavailable_reason() {
#if LAMP_WITH_CUDA
  return "this lamp was built without cuDNN's headers: cudnn.h was not found "
         "at configure time. Reconfigure with -DLAMP_CUDNN_INCLUDE_DIR=<folder "
         "of cudnn.h>, or install the nvidia-cudnn wheel matching torch's.";
#else
  return "this lamp was built against a LibTorch without CUDA.";
#endif
}

bool cudnn_batch_norm_activation_forward(
    const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
    const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, double,
    double, FusedBatchNormForward&, std::string& why) {
  why = cudnn_batch_norm_unavailable_reason();
  return false;
}

FusedBatchNormBackward cudnn_batch_norm_activation_backward(
    const torch::Tensor&, const torch::Tensor&, bool, const torch::Tensor&,
    const torch::Tensor&, const FusedBatchNormForward&, double) {
  TORCH_CHECK(false, "lamp::ops::batch_norm_relu: ",
              cudnn_batch_norm_unavailable_reason());
}

} // namespace detail
} // namespace lamp
